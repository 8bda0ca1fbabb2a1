"""The orphan sweep never takes a directory an Allocate has just handed out."""

from __future__ import annotations

import os
import time

from gpumgr.allocator import Allocation
from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from gpumgr.node.vdevices import ORPHAN_DIR_AGE_S, sweep_orphans
from gpumgr.vdevice.layout import VDeviceLayout, allocation_key
from tests.helpers import topo_path

K1, K2 = allocation_key(["x-0"]), allocation_key(["y-0"])


class Servers:
    """Two running servers nothing holds; stopping the first lets an Allocate hand the other's key out."""

    def __init__(self, state: NodeState):
        self.state, self.live, self.stopped = state, {K1: None, K2: None}, []

    def running(self):
        return dict(self.live)

    async def stop(self, key: str) -> None:
        self.stopped.append(key)
        self.live.pop(key, None)
        other = K2 if key == K1 else K1
        if other not in self.state.ledger.allocations:  # an Allocate ran while this stop waited
            await self.state.commit(lambda ledger: ledger.assign(Allocation(other, (0,), 30, 1024)))


async def test_a_key_handed_out_during_the_sweep_is_not_stopped(tmp_path):
    inv = inventory_from_topo_file(topo_path("gtx1080ti"), memory_mib=16384)
    state = NodeState("n1", inv, CheckpointStore(tmp_path / "ckpt"))
    try:
        servers = Servers(state)
        removed = await sweep_orphans(state, VDeviceLayout(tmp_path / "vd"), servers)  # type: ignore[arg-type]
        assert removed == 1 and len(servers.stopped) == 1
        assert set(state.ledger.allocations) == {K1, K2} - set(servers.stopped)
    finally:
        state.close()


def test_preparing_an_old_directory_makes_it_young_again(tmp_path):
    layout = VDeviceLayout(tmp_path)
    d = layout.prepare(K1)
    old = time.time() - 10 * ORPHAN_DIR_AGE_S
    os.utime(d, (old, old))
    assert layout.age_s(K1) > ORPHAN_DIR_AGE_S
    layout.prepare(K1)
    assert layout.age_s(K1) < ORPHAN_DIR_AGE_S
