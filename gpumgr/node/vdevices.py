"""vDevice servers and directories of the node's allocations, for both front ends: a server for an allocation's
cards, and the sweep of servers and directories that no allocation (and no claim) holds any more."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpumgr.allocator import Ledger
from gpumgr.devices.types import Inventory
from gpumgr.node.claims import claim_vdevice_keys
from gpumgr.node.limits import bus_ids
from gpumgr.node.state import NodeState
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.limits import Limits
from gpumgr.vdevice.server import VDeviceManager

log = logging.getLogger("gpumgr.vdevice")

ORPHAN_DIR_AGE_S = 60.0  # a vDevice directory with no allocation is removed once it is this old


async def start_server(manager: VDeviceManager, inventory: Inventory, key: str, limits: Limits,
                       cards: Iterable[int]) -> None:
    """Start (or restart with new limits) the vDevice server of `key`, which answers only for these cards."""
    await manager.start(key, limits, bus_ids(inventory, cards))


def held_keys(ledger: Ledger) -> set[str]:
    """vDevice keys something in the ledger holds: a container's allocation, or a DRA claim's directory."""
    return set(ledger.allocations) | claim_vdevice_keys(ledger)


async def sweep_orphans(state: NodeState, layout: VDeviceLayout, manager: VDeviceManager) -> int:
    """Stop the servers and remove the directories nothing in the ledger holds; returns how many. A directory with
    no server younger than ORPHAN_DIR_AGE_S is left: an Allocate that is still being recorded made it. The
    directories are listed off the event loop (a stat each)."""
    listed = await state.run_io(layout.keys)
    keep = held_keys(state.ledger)
    removed = 0
    running = manager.running()
    for key in set(running) | set(listed):
        if key in keep:
            continue
        if key not in running and layout.age_s(key) < ORPHAN_DIR_AGE_S:
            continue
        # asked again right before stopping: each earlier stop yields to the event loop, and an Allocate may have
        # handed this directory out meanwhile (`layout.prepare` also makes it young again)
        if key in held_keys(state.ledger):
            continue
        await manager.stop(key)
        removed += 1
    return removed
