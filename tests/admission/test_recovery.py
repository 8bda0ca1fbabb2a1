"""Recovery that keeps every running container whole: after falling back to the previous checkpoint generation,
and with DRA claims in the same ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpumgr.agent.reconcile import reconcile
from gpumgr.allocator import Allocation, ClaimHolder
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.requests import podspec
from gpumgr.vdevice.limits import Limits
from tests.e2e.harness import sim_node

CORE = podspec.RESOURCE_CORE
UNIT = 256


def vdevice_dir(admitted, container: str = "main") -> Path:
    mounts = {m.container_path: m.host_path for m in admitted.container(container).responses[CORE].mounts}
    return Path(mounts["/etc/vcuda"])


async def test_after_falling_back_to_the_previous_generation_every_running_container_has_its_server_and_limits():
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        got = {name: await node.run_pod(name, [("main", 20 + i, 4 + i)]) for i, name in enumerate("abcd")}
        keys = {name: vdevice_dir(a).name for name, a in got.items()}
        assert set(node.agent.service.vdevices.running()) == set(keys.values())
        await node.stop_agent()
        store = CheckpointStore(node.config.checkpoint_dir)
        store.path.write_bytes(store.path.read_bytes()[:40])  # a torn write of the current generation
        prev = store.load()
        assert prev.fell_back and any(not a.verified for a in prev.snapshot.ledger.allocations.values())
        await node.start_agent()
        running = node.agent.service.vdevices.running()
        assert set(running) == set(keys.values())
        for i, (name, key) in enumerate(keys.items()):
            pod = node.pod(name)
            limits = Limits.parse((vdevice_dir(got[name]) / "limits").read_text())
            assert (limits.pod_uid, limits.container_name) == (pod["metadata"]["uid"], "main")
            assert limits.core_limit == 20 + i and limits.devices[0].memory_limit_bytes == (4 + i) * UNIT << 20
            assert (vdevice_dir(got[name]) / "vcuda.sock").exists()
            assert node.agent.state.ledger.held_by(key).verified


async def test_a_dra_claim_in_the_ledger_survives_reconcile_and_restart_and_is_counted_as_used():
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        claim = Allocation(key="dra/0b7e-claim-uid/0", cards=(0,), cores=60, memory_mib=40 * UNIT,
                           holder=ClaimHolder(uid="0b7e-claim-uid", namespace="default", name="c"),
                           verified=True)
        await node.agent.state.commit(lambda ledger: ledger.assign(claim))
        for why in ("periodic", "pods changed"):
            await reconcile(node.agent.service, True, 0.0, why, full=why == "periodic")
            assert node.agent.state.ledger.held_by(claim.key) == claim
        await node.stop_agent()
        await node.start_agent()
        assert node.agent.state.ledger.held_by(claim.key) == claim
        # the claim's room is used: a pod that needs more than what is left of card 0 goes to card 1
        got = await node.run_pod("p", [("main", 50, 8)])
        uuid = got.container("main").responses[CORE].envs["NVIDIA_VISIBLE_DEVICES"]
        assert node.inventory.by_uuid(uuid).index == 1
        uid = node.pod("p")["metadata"]["uid"]
        await node.delete_pod("p")
        for _ in range(500):  # the pod watch has seen the deletion (reconcile frees what its cache says is gone)
            if node.agent.pods.get(uid) is None:
                break
            await asyncio.sleep(0.01)
        await reconcile(node.agent.service, True, 0.0, "periodic")
        assert node.agent.state.ledger.held_by(claim.key) == claim
        assert [a.key for a in node.agent.state.ledger.allocations.values()] == [claim.key]
