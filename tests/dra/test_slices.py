"""The agent's ResourceSlice: contents per the DRA contract, valid against the Kubernetes OpenAPI schema (1.34
and the newest kubernetes-validate ships), updated in place on health changes, own slices only."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes_validate
import pytest

from gpumgr.dra.config import DRIVER_NAME
from gpumgr.dra.slices import build_spec
from gpumgr.requests.quantity import parse_int
from tests.dra.harness import CARD_MIB, NODE, DraNode, device_classes, inventory

VERSIONS = ["1.34.0", kubernetes_validate.latest_version()]


def published(node: DraNode) -> list[dict[str, Any]]:
    return [s for s in node.api.store.list_resource("resourceslices") if s["spec"]["driver"] == DRIVER_NAME]


async def until(predicate: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("version", VERSIONS)
def test_slice_and_device_classes_validate_against_the_kubernetes_schema(version: str):
    spec = build_spec(inventory(4), NODE, DRIVER_NAME, {1: "xid-79"}, 256, 3)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{NODE}-x"},
            "spec": spec}
    kubernetes_validate.validate(body, version, strict=True)
    for dc in device_classes():
        kubernetes_validate.validate(dc, version, strict=True)


def test_a_broken_slice_does_fail_the_schema():
    spec = build_spec(inventory(1), NODE, DRIVER_NAME, {}, 256, 1)
    spec["devices"][0]["capacity"]["cores"]["requestPolicy"]["validRange"]["stepp"] = "1"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(body, VERSIONS[-1], strict=True)


async def test_slice_contents(node: DraNode):
    await until(lambda: len(published(node)) == 1)
    [s] = published(node)
    spec = s["spec"]
    assert spec["nodeName"] == NODE and spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    d0, d1, d2 = spec["devices"][:3]
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert d0["allowMultipleAllocations"] is True
    attrs = d0["attributes"]
    assert attrs["uuid"] == {"string": node.inventory.gpus[0].uuid}
    assert attrs["index"] == {"int": 0} and attrs["minor"] == {"int": 0} and attrs["numaNode"] == {"int": 0}
    assert attrs["driverVersion"] == {"version": "550.54.15"} and attrs["cudaVersion"] == {"version": "12.4.0"}
    assert attrs["pciBusID"] == {"string": "00000000:10:00.0"}
    assert "resource.kubernetes.io/pcieRoot" in attrs
    # NVLink pairs (0,1) and (2,3) share a domain, across pairs they differ
    assert d0["attributes"]["nvlinkDomain"] == d1["attributes"]["nvlinkDomain"]
    assert d0["attributes"]["nvlinkDomain"] != d2["attributes"]["nvlinkDomain"]
    mem = d0["capacity"]["memory"]
    assert mem["value"] == f"{CARD_MIB // 1024}Gi"
    assert mem["requestPolicy"] == {"default": "16Gi", "validRange": {"min": "256Mi", "max": "16Gi", "step": "256Mi"}}
    assert d0["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}
    assert "taints" not in d0


async def test_health_taints_on_and_off_update_the_same_slice(node: DraNode):
    await until(lambda: len(published(node)) == 1)
    [before] = published(node)
    assert node.state is not None
    assert await node.state.set_reason(2, "xid 79 (fell off the bus)", True)
    await until(lambda: "taints" in published(node)[0]["spec"]["devices"][2])
    [tainted] = published(node)
    assert tainted["metadata"]["uid"] == before["metadata"]["uid"]  # updated, not recreated
    assert tainted["spec"]["pool"]["generation"] == 2
    assert tainted["spec"]["devices"][2]["taints"] == [
        {"key": "vgpu.gpumgr.io/unhealthy", "value": "xid-79-fell-off-the-bus", "effect": "NoSchedule"}]
    # the scheduler stand-in avoids the tainted card for new claims
    from tests.dra.harness import share_request

    node.create_template("t", [share_request(memory="1Gi", cores=60)])
    for i in range(3):
        await node.run_pod(f"p{i}", {"gpu": {"resourceClaimTemplateName": "t"}})
    assert sorted(a.cards[0] for a in node.dra_allocations().values()) == [0, 1, 3]
    await node.state.set_reason(2, "xid 79 (fell off the bus)", False)
    await until(lambda: "taints" not in published(node)[0]["spec"]["devices"][2])
    [healed] = published(node)
    assert healed["metadata"]["uid"] == before["metadata"]["uid"] and healed["spec"]["pool"]["generation"] == 3
    await node.run_pod("p3", {"gpu": {"resourceClaimTemplateName": "t"}})
    assert sorted(a.cards[0] for a in node.dra_allocations().values()) == [0, 1, 2, 3]


async def test_only_own_slices_are_touched_and_strays_of_ours_are_removed(node: DraNode):
    await until(lambda: len(published(node)) == 1)
    store = node.api.store
    other_driver = {"metadata": {"name": "other"}, "spec": {"driver": "gpu.example.com", "nodeName": NODE,
                                                            "pool": {"name": NODE, "generation": 1}, "devices": []}}
    other_node = {"metadata": {"name": "elsewhere"}, "spec": {"driver": DRIVER_NAME, "nodeName": "node-b",
                                                              "pool": {"name": "node-b", "generation": 1},
                                                              "devices": []}}
    stray = {"metadata": {"name": "stray"}, "spec": {"driver": DRIVER_NAME, "nodeName": NODE,
                                                     "pool": {"name": NODE, "generation": 1}, "devices": []}}
    for s in (other_driver, other_node, stray):
        store.create_object("resourceslices", s)
    assert node.fe is not None
    node.fe.publisher.poke()
    await until(lambda: store.get_object("resourceslices", "stray") is None)
    names = sorted(s["metadata"]["name"] for s in store.list_resource("resourceslices"))
    assert names == sorted(["other", "elsewhere", f"{NODE}-{DRIVER_NAME}"])


async def test_someone_deleting_the_slice_gets_it_back_and_no_gpus_means_no_slice(node: DraNode):
    await until(lambda: len(published(node)) == 1)
    assert node.fe is not None
    store = node.api.store
    store.delete_object("resourceslices", f"{NODE}-{DRIVER_NAME}")
    node.fe.publisher.poke()
    await until(lambda: len(published(node)) == 1)
    # a node whose GPUs are gone publishes nothing
    from gpumgr.devices.types import Inventory

    assert node.state is not None
    node.state.inventory = Inventory(gpus=(), levels=())
    node.fe.publisher.poke()
    await until(lambda: published(node) == [])


async def test_a_health_change_during_a_publish_is_not_lost(node: DraNode):
    """The slice write of one change is on its way when the next change comes: the next must be published too
    (not only at the periodic check a minute later)."""
    await until(lambda: len(published(node)) == 1)
    assert node.state is not None and node.fe is not None
    kube = node.fe.publisher.kube
    real_replace = kube.replace_slice
    state = node.state

    async def replace_while_card_3_turns_sick(name: str, body: dict) -> dict:
        kube.replace_slice = real_replace  # type: ignore[method-assign]
        await state.set_reason(3, "late", True)  # lands after this body was built
        return await real_replace(name, body)

    kube.replace_slice = replace_while_card_3_turns_sick  # type: ignore[method-assign]
    await state.set_reason(0, "first", True)
    # well within the publisher's periodic check (PERIOD_S, 60 s), which would also publish it
    await until(lambda: "taints" in published(node)[0]["spec"]["devices"][3], timeout=30)
    assert "taints" in published(node)[0]["spec"]["devices"][0]


@pytest.mark.parametrize("card_mib", [81559, 23034, 23028, 24564, 16384])
def test_a_slice_of_real_card_memory_sizes_is_accepted_by_the_api_server(card_mib: int):
    from dataclasses import replace

    from gpumgr.sim.kubeapi import KubeStore

    inv = inventory(2)
    inv = replace(inv, gpus=tuple(replace(g, memory_mib=card_mib) for g in inv.gpus))
    # gpu-1 shares its card with device-plugin pods (`both` mode): 60 cores and 1000 MiB are held there
    spec = build_spec(inv, NODE, DRIVER_NAME, {}, 256, 1, {1: (60, 1000)})
    store = KubeStore()
    store.create_object("resourceslices", {"metadata": {"name": "s"}, "spec": spec})  # 422 raises
    whole, shared = spec["devices"]
    mem = whole["capacity"]["memory"]["requestPolicy"]
    mib = 2**20
    assert parse_int(whole["capacity"]["memory"]["value"]) == card_mib * mib
    assert parse_int(mem["validRange"]["max"]) == parse_int(mem["default"]) == card_mib // 256 * 256 * mib
    assert shared["capacity"]["cores"]["value"] == shared["capacity"]["cores"]["requestPolicy"]["validRange"]["max"] \
        == "40"


def test_a_card_held_whole_elsewhere_is_left_out_of_the_slice():
    spec = build_spec(inventory(3), NODE, DRIVER_NAME, {}, 256, 1, {0: (100, 4096), 2: (10, CARD_MIB - 256)})
    assert [d["name"] for d in spec["devices"]] == ["gpu-1"]
