"""The node's allocation state: one ledger, changed in one place, checkpointed before anyone is answered.

Every change runs `commit(fn)`: `fn` changes a copy of the ledger, the copy is written to the checkpoint, and
only then does it replace the live ledger. A failed write leaves the live ledger as it was. Health is kept
beside it (reasons per card) and is not checkpointed: it is re-learnt from the cards on every start.
`load_checkpoint` brings the ledger of the last run back at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gpumgr.allocator import Ledger
from gpumgr.devices.types import Inventory
from gpumgr.node.checkpoint import CheckpointError, CheckpointStore
from gpumgr.topology.cost import Topology

log = logging.getLogger("gpumgr.state")
T = TypeVar("T")


def load_checkpoint(state: NodeState) -> None:
    """Make the newest usable generation of `state.store` the live ledger. Nothing usable (damaged, another node's,
    other cards): the ledger stays empty and the front ends rebuild it from the kubelet's checkpoint, the live pods
    and the claims in the API."""
    store = state.store
    try:
        res = store.load(expected_node=state.node_name)
    except CheckpointError as e:
        log.error("%s; starting from the kubelet checkpoint and the live pods instead", e)
        return
    for p in res.problems:
        log.error("checkpoint skipped: %s", p)
    snap = res.snapshot
    if snap is None:
        log.info("no checkpoint in %s: first start", store.dir)
        return
    if [c.memory_mib for c in snap.ledger.cards] != [g.memory_mib for g in state.inventory.gpus]:
        log.error("checkpoint %s describes other cards than this node has; rebuilding from the kubelet "
                  "checkpoint and the live pods", snap.path)
        return
    state.ledger = snap.ledger
    log.info("checkpoint generation %d loaded from %s: %d allocations", snap.generation, snap.path,
             len(snap.ledger.allocations))


class NodeState:
    def __init__(self, node_name: str, inventory: Inventory, store: CheckpointStore, memory_unit_mib: int = 256):
        self.node_name = node_name
        self.inventory = inventory
        self.topology = Topology.of(inventory)  # levels and NUMA nodes (NUMA breaks ties)
        self.store = store
        self.memory_unit_mib = memory_unit_mib
        self.ledger = Ledger(g.memory_mib for g in inventory.gpus)
        self.lock = asyncio.Lock()
        self.health_reasons: dict[int, set[str]] = {g.index: set() for g in inventory.gpus}
        self.version = 0  # bumps on every change of allocation or health
        self._changed = asyncio.Condition()
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")  # never queued behind API calls
        # small file I/O of the front ends: never queued behind API calls, nor behind a checkpoint write's fsyncs
        self._files = ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-files")
        self.checkpoint_writes = 0
        self.checkpoint_failures = 0
        self.last_checkpoint_s = 0.0

    # -- allocation -----------------------------------------------------------------------------------------
    async def commit(self, change: Callable[[Ledger], T]) -> T:
        """Apply `change` to a copy, checkpoint it, then make it live. Raises whatever `change` or the write
        raises, with nothing changed. Runs to the end even if the caller is cancelled (a kubelet that gave up on
        an RPC): a written checkpoint always becomes the live ledger, and writes never overlap."""
        return await asyncio.shield(asyncio.ensure_future(self._commit(change)))

    async def _commit(self, change: Callable[[Ledger], T]) -> T:
        async with self.lock:
            trial = self.ledger.copy()
            result = change(trial)
            await self._save(trial)
            for i, reasons in self.health_reasons.items():  # health may have changed during the write
                trial.set_healthy(i, not reasons)
            self.ledger = trial
        await self._bump()
        return result

    async def _save(self, ledger: Ledger) -> None:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            await loop.run_in_executor(self._io, self.store.save, ledger, self.node_name)
        except OSError as e:
            self.checkpoint_failures += 1
            log.error("checkpoint write to %s failed: %s", self.store.path, e)
            raise
        self.checkpoint_writes += 1
        self.last_checkpoint_s = time.perf_counter() - t0

    def run_io(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """Run blocking file I/O of the front ends' own (vDevice directories, CDI specs, the kubelet checkpoint)
        off the event loop, on a thread of the node's rather than the default pool that API calls may fill, and
        not behind the checkpoint writes (an Allocate would wait for another commit's fsyncs)."""
        return asyncio.get_running_loop().run_in_executor(self._files, fn, *args)

    def close(self) -> None:
        self._io.shutdown(wait=True)
        self._files.shutdown(wait=True)

    # -- health ---------------------------------------------------------------------------------------------
    def healthy(self, index: int) -> bool:
        return not self.health_reasons[index]

    async def set_reason(self, index: int, reason: str, present: bool) -> bool:
        """Add or clear one reason for card `index` to be unhealthy; True when the card's health changed."""
        if index not in self.health_reasons:
            return False
        reasons = self.health_reasons[index]
        before = not reasons
        if present:
            reasons.add(reason)
        else:
            reasons.discard(reason)
        after = not reasons
        if before == after:
            return False
        self.ledger.set_healthy(index, after)
        await self._bump()
        return True

    # -- change notification --------------------------------------------------------------------------------
    async def _bump(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def wait_change(self, seen: int, timeout: float | None = None) -> int:
        """Return the current version once it differs from `seen` (or after `timeout`)."""
        async with self._changed:
            if self.version == seen:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait_for(lambda: self.version != seen), timeout)
            return self.version
