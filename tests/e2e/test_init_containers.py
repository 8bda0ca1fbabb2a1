"""GPU init containers: the kubelet hands their devices on to the pod's app containers, so the pod needs the
larger of the two on those cards, not the sum; every container still gets its own limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumgr.requests import podspec
from gpumgr.vdevice.limits import Limits
from tests.e2e.harness import mounts_of, sim_node

CORE = podspec.RESOURCE_CORE


@pytest.mark.parametrize(("init", "app"), [((50, 4), (100, 0)), ((100, 0), (50, 4)), ((100, 0), (200, 0)),
                                           ((50, 4), (30, 4)), ((30, 4), (50, 8))])
async def test_init_and_app_containers_share_their_pods_reservation(init, app):
    async with sim_node("dgx-a100") as node:
        admitted = await node.run_pod("p", [("main", *app)], init_containers=[("setup", *init)])
        ledger = node.agent.state.ledger
        held = node.kubelet.pod_devices(node.pod("p")["metadata"]["uid"])
        union: dict[int, set[str]] = {}
        for resources in held.values():
            for d in resources.get(CORE, ()):
                union.setdefault(node.inventory.by_uuid(d.split("::")[0]).index, set()).add(d)
        used = {c.index: c.used_cores for c in ledger.cards if c.used_cores}
        assert used == {card: len(ids) for card, ids in union.items()}, (used, {k: len(v) for k, v in union.items()})
        for name, (cores, units) in (("setup", init), ("main", app)):
            lim = Limits.parse((Path(mounts_of(admitted, name)["/etc/vcuda"]) / "limits").read_text())
            assert lim.container_name == name
            assert lim.core_limit == (cores if cores < 100 else 0)
            if cores < 100:
                assert lim.devices[0].memory_limit_bytes == units * 256 << 20
        # the cards the kubelet thinks free really are free: another pod fills the rest of the node
        free_cards = sum(1 for c in ledger.cards if c.mode == "free")
        await node.run_pod("rest", [("main", 100 * free_cards, 0)])
        assert all(c.mode != "free" for c in node.agent.state.ledger.cards)


@pytest.mark.parametrize(("init", "app"), [((30, 4), (50, 8)), ((100, 0), (50, 4))])
async def test_a_rebuilt_ledger_keeps_one_reservation_per_reused_set(init, app):
    from gpumgr.node.checkpoint import CheckpointStore

    async with sim_node("dgx-a100") as node:
        await node.run_pod("p", [("main", *app)], init_containers=[("setup", *init)])
        before = {c.index: c.used_cores for c in node.agent.state.ledger.cards if c.used_cores}
        await node.stop_agent()
        store = CheckpointStore(node.config.checkpoint_dir)
        store.path.write_text("{")
        store.prev.unlink(missing_ok=True)
        await node.start_agent()
        ledger = node.agent.state.ledger
        assert {c.index: c.used_cores for c in ledger.cards if c.used_cores} == before
        assert sorted(a.reserve for a in ledger.allocations.values()) == [False, True]
