"""Restarts are normal: the kubelet's, the agent's, and a damaged checkpoint; nothing lost, nothing doubled."""

from __future__ import annotations

import asyncio
import json

from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.requests import podspec
from tests.e2e.harness import sim_node

CORE = podspec.RESOURCE_CORE


def holdings(node) -> dict[str, tuple[tuple[int, ...], int, int]]:
    return {a.pod: (a.cards, a.cores, a.memory_mib) for a in node.agent.state.ledger.allocations.values()}


async def test_kubelet_restart_re_registers_and_keeps_every_allocation():
    async with sim_node("dgx-a100") as node:
        await node.run_pod("a", [("main", 200, 0)])
        await node.run_pod("b", [("main", 30, 8)])
        before = holdings(node)
        count = node.kubelet.registration_count(CORE)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await node.kubelet.restart()
        await node.kubelet.wait_registered(CORE, timeout=30, count=count + 1)
        took = loop.time() - t0
        print(f"re-registered {took * 1000:.0f} ms after the kubelet restart")
        await node.wait_plugins()
        assert holdings(node) == before
        # the node keeps working after the restart, and the old holdings are still respected
        c = await node.run_pod("c", [("main", 500, 0)])
        cards = {node.inventory.by_uuid(u).index
                 for u in c.container("main").responses[CORE].envs["NVIDIA_VISIBLE_DEVICES"].split(",")}
        assert not cards & set(before["a"][0]) and not cards & set(before["b"][0])


async def test_agent_restart_restores_state_and_vdevice_servers():
    async with sim_node("dgx-a100") as node:
        await node.run_pod("a", [("main", 100, 0)])
        b = await node.run_pod("b", [("main", 25, 4)])
        before = holdings(node)
        await node.stop_agent()
        await node.start_agent()
        assert holdings(node) == before
        sock = b.container("main").responses[CORE].mounts
        vdir = next(m.host_path for m in sock if m.container_path == "/etc/vcuda")
        from pathlib import Path

        assert (Path(vdir) / "vcuda.sock").exists() and (Path(vdir) / "limits").exists()
        assert node.agent.service.vdevices.running()


async def test_corrupted_checkpoint_on_start_is_rebuilt_from_the_kubelet_and_live_pods():
    async with sim_node("dgx-a100") as node:
        await node.run_pod("a", [("main", 300, 0)])
        await node.run_pod("b", [("main", 40, 8), ("side", 10, 2)])
        before = holdings(node)
        await node.stop_agent()
        store = CheckpointStore(node.config.checkpoint_dir)
        store.path.write_text('{"format": "gpumgr-checkpoint", "version": 1, "ledger": {')  # truncated
        store.prev.write_bytes(b"\x00garbage")
        await node.start_agent()
        assert holdings(node) == {k: v for k, v in before.items()}
        assert all(a.verified for a in node.agent.state.ledger.allocations.values())
        # and the rebuilt ledger was written back as a good checkpoint
        doc = json.loads(store.path.read_text())
        assert len(doc["ledger"]["allocations"]) == 3


async def test_pods_deleted_while_the_agent_was_down_are_freed_and_lost_ones_restored():
    async with sim_node("dgx-a100") as node:
        await node.run_pod("stays", [("main", 100, 0)])
        await node.run_pod("goes", [("main", 100, 0)])
        await node.stop_agent()
        await node.delete_pod("goes")
        # our checkpoint loses "stays" (an older generation, say): the kubelet still knows it
        CheckpointStore(node.config.checkpoint_dir).path.unlink()
        CheckpointStore(node.config.checkpoint_dir).prev.unlink(missing_ok=True)
        await node.start_agent()
        assert set(holdings(node)) == {"stays"}


async def test_a_deleted_plugin_socket_is_served_and_registered_again():
    async with sim_node("gtx1080ti") as node:
        await node.run_pod("a", [("main", 100, 0)])
        count = node.kubelet.registration_count(CORE)
        (node.config.device_plugin_dir / "vcore.sock").unlink()
        await node.kubelet.wait_registered(CORE, timeout=30, count=count + 1)
        await node.wait_plugins()
        assert (node.config.device_plugin_dir / "vcore.sock").exists()
        assert set(holdings(node)) == {"a"}
        await node.run_pod("b", [("main", 100, 0)])


async def test_static_pods_known_to_the_kubelet_by_their_mirror_uid():
    from gpumgr.agent.reconcile import reconcile
    from gpumgr.kube.pod_cache import MIRROR
    from gpumgr.sim.kubelet import ContainerRequest

    async with sim_node("gtx1080ti") as node:
        static_uid = "6d5a3c1b0f9e8d7c6b5a4f3e2d1c0b9a"  # the kubelet's hash of the static pod's manifest
        pod = node.create_pod("etcd-ish-gpu", [("main", 30, 4)], annotations={MIRROR: static_uid})
        await node.kubelet.admit_pod(static_uid, [ContainerRequest("main", {CORE: 30, "tencent.com/vcuda-memory": 4})])
        node.api.store.set_pod_phase("default", "etcd-ish-gpu", "Running")
        (a,) = node.agent.state.ledger.allocations.values()
        assert a.verified and a.pod_uid == pod["metadata"]["uid"]
        report = await reconcile(node.agent.service, True, 60, "periodic")
        assert report.restored == 0 and report.freed_gone == 0 and len(node.agent.state.ledger.allocations) == 1


async def test_a_static_pods_mirror_recreated_under_a_new_uid_keeps_the_share_it_runs_on():
    """The API server may delete a static pod's mirror pod and make a new one (new UID, same config.mirror): the
    static pod runs on; the kubelet still records its devices under config.mirror, so nothing is freed."""
    from gpumgr.agent.reconcile import reconcile
    from gpumgr.kube.pod_cache import MIRROR
    from gpumgr.sim.kubelet import ContainerRequest

    async with sim_node("gtx1080ti") as node:
        static_uid = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
        node.create_pod("static-gpu", [("main", 30, 4)], annotations={MIRROR: static_uid})
        await node.kubelet.admit_pod(static_uid, [ContainerRequest("main", {CORE: 30, "tencent.com/vcuda-memory": 4})])
        node.api.store.set_pod_phase("default", "static-gpu", "Running")
        (key,) = node.agent.state.ledger.allocations
        await node.delete_pod("static-gpu")
        again = node.create_pod("static-gpu", [("main", 30, 4)], annotations={MIRROR: static_uid})
        node.api.store.set_pod_phase("default", "static-gpu", "Running")
        for _ in range(500):  # the watch has seen the old mirror deleted and the new one
            if node.agent.pods.get(again["metadata"]["uid"]) is not None:
                break
            await asyncio.sleep(0.01)
        for why, full in (("pods changed", False), ("periodic", True), ("pods changed", False)):
            report = await reconcile(node.agent.service, True, 60, why, full=full)
            assert report.freed_gone == 0 and key in node.agent.state.ledger.allocations, (why, report.summary())
        assert node.agent.state.ledger.held_by(key).pod_uid == again["metadata"]["uid"]
