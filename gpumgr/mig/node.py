"""MIG in the running agent: the manager over NodeState (its async commit, called from the thread the blocking
NVML work runs on), and the start-up pass every front end waits for: reconcile against NVML, then destroy the
instances of DRA claims that nobody holds any more (a crash between a claim's create and its checkpoint, or
between its unprepare's release and destroy: the kubelet's retry makes it again)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gpumgr.allocator.ledger import Ledger
from gpumgr.devices.backend import MigBackend
from gpumgr.mig.apply import keeper
from gpumgr.mig.layout import Layout
from gpumgr.mig.manager import MigManager
from gpumgr.mig.reconcile import Plan
from gpumgr.mig.types import MigError
from gpumgr.node.state import NodeState

log = logging.getLogger("gpumgr.mig")


def manager_for(state: NodeState, backend: MigBackend, loop: asyncio.AbstractEventLoop) -> MigManager:
    """A manager whose calls run on a worker thread (asyncio.to_thread) and commit through `state` on `loop`."""
    def commit(change: Callable[[Ledger], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(state.commit(change), loop).result()

    return MigManager(backend, commit, lambda: state.ledger)


async def start(state: NodeState, backend: MigBackend, layout: Layout | None = None) -> tuple[MigManager, Plan]:
    """`layout`: instances nobody recorded that it wants are adopted (see apply.keeper), the rest destroyed."""
    manager = manager_for(state, backend, asyncio.get_running_loop())
    keep = await asyncio.to_thread(keeper, manager, layout) if layout is not None else None
    plan = await asyncio.to_thread(manager.reconcile, keep)
    for slot in [s for s in state.ledger.slots.values() if s.origin == "claim"]:
        if not state.ledger.slot_holders.get(slot.name):
            try:
                await asyncio.to_thread(manager.destroy, slot.name)
                log.info("MIG card %d: destroyed %s at memory slice %d: its claim holds it no more", slot.card,
                         slot.profile, slot.start)
            except MigError as e:
                log.error("%s (kept in the ledger; retried at the next start)", e)
    return manager, plan
