"""Health end to end through ListAndWatch, and what the agent publishes on its Node."""

from __future__ import annotations

import json

from gpumgr.node import inventory as node_inventory
from gpumgr.requests import podspec
from tests.e2e.harness import env_of, sim_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


def published_unhealthy(node) -> frozenset[int]:
    ann = node.api.store.get_node(node.node_name)["metadata"]["annotations"][podspec.ANN_NODE_INVENTORY]
    return node_inventory.decode(ann).unhealthy


def card_health(node, resource: str, uuid: str) -> set[str]:
    return {h for d, h in node.kubelet.devices(resource).items() if d.startswith(uuid + "::")}


async def test_xid_makes_a_card_unhealthy_in_listandwatch_and_recovery_brings_it_back():
    async with sim_node("gtx1080ti") as node:
        g1 = node.inventory.gpus[1]
        node.backend.inject_xid(1, 79)  # fallen off the bus / critical
        await node.kubelet.wait_for(lambda: card_health(node, CORE, g1.uuid) == {"Unhealthy"}, 30)
        await node.kubelet.wait_for(lambda: card_health(node, MEM, g1.uuid) == {"Unhealthy"}, 30)
        assert card_health(node, CORE, node.inventory.gpus[0].uuid) == {"Healthy"}
        # no new allocation lands on it
        pod = await node.run_pod("after", [("main", 100, 0)])
        assert env_of(pod, "main")["NVIDIA_VISIBLE_DEVICES"] == node.inventory.gpus[0].uuid
        node.backend.recover(1)
        await node.kubelet.wait_for(lambda: card_health(node, CORE, g1.uuid) == {"Healthy"}, 30)
        await node.kubelet.wait_for(lambda: published_unhealthy(node) == frozenset(), 30)


async def test_ignored_xid_changes_nothing_and_temperature_uses_hysteresis():
    async with sim_node("gtx1080ti") as node:
        g0 = node.inventory.gpus[0]
        node.backend.inject_xid(0, 13)  # an application error: ignored by default
        node.backend.set_temperature(0, 97)
        await node.kubelet.wait_for(lambda: card_health(node, CORE, g0.uuid) == {"Unhealthy"}, 30)
        assert node.agent.state.health_reasons[0] == {"temperature"}
        await node.kubelet.wait_for(lambda: published_unhealthy(node) == {0}, 30)  # the extender is told
        node.backend.set_temperature(0, 92)  # below 95 but not below 90: still unhealthy
        await node.agent.health.check_now()
        assert card_health(node, CORE, g0.uuid) == {"Unhealthy"}
        node.backend.set_temperature(0, 89)
        await node.kubelet.wait_for(lambda: card_health(node, CORE, g0.uuid) == {"Healthy"}, 30)


async def test_node_gets_inventory_annotation_and_labels():
    async with sim_node("dgx-a100", memory_mib=40960) as node:
        meta = node.api.store.get_node(node.node_name)["metadata"]
        inv = node_inventory.decode(meta["annotations"][podspec.ANN_NODE_INVENTORY])
        assert inv.inventory.count == 8 and inv.inventory.levels[0][1] == "NV12" and inv.memory_unit_mib == 256
        labels = meta["labels"]
        assert labels["gpumgr.io/gpu.count"] == "8" and labels["gpumgr.io/gpu.memory"] == "40960"
        assert "gaia.tencent.com/gpu-model" in labels
        rv = node.api.store.get_node(node.node_name)["metadata"]["resourceVersion"]
        await node.agent.publish_labels()  # nothing changed: no write (no churn)
        assert node.api.store.get_node(node.node_name)["metadata"]["resourceVersion"] == rv
        assert json.loads(meta["annotations"][podspec.ANN_NODE_INVENTORY])["version"] == 1
