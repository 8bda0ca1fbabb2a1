"""What the agent writes, the next start reads: a pod spec's numbers beyond the checkpoint's bounds never reach
the ledger (the bounds are in the record's constructors, which the writer and both readers go through)."""

from __future__ import annotations

from gpumgr.node.checkpoint import CheckpointStore
from tests.e2e.harness import sim_node

HUGE = 3_000_000_000  # vcuda-memory units: a valid pod spec (up to 2^63-1), more than a checkpoint records


async def test_a_guess_naming_a_pod_that_asks_more_memory_than_recordable_survives_a_restart():
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        # bound here, never admitted (the kubelet refuses it), but a candidate of the next whole-card Allocate
        node.create_pod("a-big", [("main", 100, HUGE)])
        pod = node.create_pod("b-whole", [("main", 100, 0)])
        await node.admit(pod, start=False)  # Allocate guesses; no PreStartContainer names the owner yet
        allocs = dict(node.agent.state.ledger.allocations)
        assert len(allocs) == 1
        await node.stop_agent()
        res = CheckpointStore(node.config.checkpoint_dir).load()
        assert not res.problems and res.snapshot is not None, res.problems
        assert res.snapshot.ledger.allocations == allocs
        await node.start_agent()
        assert set(node.agent.state.ledger.allocations) == set(allocs)


def test_a_share_asking_more_memory_than_recordable_is_no_candidate_of_a_guess():
    from gpumgr.devices.spec import inventory_from_topo_file
    from gpumgr.node import binding
    from tests.helpers import topo_path

    inv = inventory_from_topo_file(topo_path("gtx1080ti"), memory_mib=16384)

    def pod(name: str, units: int) -> dict:
        limits = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": str(units)}
        return {"metadata": {"name": name, "namespace": "default", "uid": name},
                "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
                "status": {"phase": "Pending"}}

    got = binding.candidates([pod("huge", HUGE), pod("fine", 8)], inv, 30, set())
    assert [c.name for c in got] == ["fine"]
