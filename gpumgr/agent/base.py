"""The state every part of the device plugins' `AllocationService` shares, and what they all read: the kubelet's
checkpoint (cached), the node's pending pods asking a size, who holds what in the ledger, and which holders the
kubelet has let go. The parts build on it in one line, with no part importing one that imports it back:
base <- release <- podwrites <- settle <- {preferred, allocate, prestart} <- service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumgr.agent.errors import PluginError
from gpumgr.agent.gone import gone
from gpumgr.agent.kubelet_cache import KubeletCheckpointCache, Stamp
from gpumgr.agent.ports import Annotator, Events, PodSource, ServiceConfig
from gpumgr.allocator import Allocation, Ledger
from gpumgr.deviceplugin import ids as devids
from gpumgr.node import binding
from gpumgr.node.claims import is_claim
from gpumgr.node.kubelet_checkpoint import KubeletCheckpoint, KubeletCheckpointError
from gpumgr.node.limits import LimitsMemo
from gpumgr.node.owner import allocation_for
from gpumgr.node.state import NodeState
from gpumgr.requests import podspec
from gpumgr.requests.choices import NO_CORDON, Cordon
from gpumgr.vdevice.layout import VDeviceLayout, allocation_key
from gpumgr.vdevice.server import VDeviceManager

log = logging.getLogger("gpumgr.agent")

WATCH_LAG_S = 0.3  # how long Allocate waits for the pod watch before listing pods live
NAMELESS_GRACE_S = 5.0  # an allocation made for no known pod is not judged dead before this age


class ServiceBase:
    """The shared state of `AllocationService` and the helpers every part of it reads."""

    def __init__(self, state: NodeState, pods: PodSource, layout: VDeviceLayout, vdevices: VDeviceManager,
                 config: ServiceConfig, annotator: Annotator | None = None, events: Events | None = None):
        self.state = state
        self.pods = pods
        self.layout = layout
        self.vdevices = vdevices
        self.config = config
        self.annotator = annotator
        self.events = events
        self.limits = LimitsMemo(state.inventory, state.memory_unit_mib)  # each container's limits, from its pod
        inv = state.inventory
        self._core_ids = {g.index: devids.core_ids(g) for g in inv.gpus}
        self._mem_ids = {g.index: devids.memory_ids(g, state.memory_unit_mib) for g in inv.gpus}
        self._annotate_tasks: set[asyncio.Task[None]] = set()
        self._api_slots = asyncio.Semaphore(4)  # background API calls at once (they run in threads)
        self._kubelet = KubeletCheckpointCache(self.config.kubelet_checkpoint)
        self._advertised = {"c": {d: i for i, ids in self._core_ids.items() for d in ids},  # ID -> its card
                            "m": {d: i for i, ids in self._mem_ids.items() for d in ids}}
        # vcuda-memory units of the container being admitted, when its memory Allocate came before its core one
        # (when, units, kubelet checkpoint stamp then); the kubelet writes its checkpoint once a container's
        # resources are all allocated (or its admission failed), so a changed stamp means the hint is stale
        self._memory_hint: tuple[float, int, Stamp | None] | None = None
        # a core Allocate is waiting for its container's memory Allocate (the checkpoint stamp then), or None
        self._open_core: Stamp | None | bool = False
        self.cordon: Callable[[], Cordon] = lambda: NO_CORDON  # the node's cordon; the daemon sets its watch
        self.unsafe_refusals = 0  # Allocates refused because any answer could strand the pod being admitted
        self.prestart_failures = 0  # pods failed at PreStart because they could not be made to fit
        self._failing: OrderedDict[str, str] = OrderedDict()  # uid -> why, of pods failed at PreStart

    # -- the kubelet checkpoint -------------------------------------------------------------------------------
    async def kubelet_checkpoint(self, fresh: bool = False) -> KubeletCheckpoint:
        """The kubelet's checkpoint, parsed again (off the event loop) only when the file may have changed (see
        kubelet_cache.py): an unchanged file costs one stat, with no wait for the I/O thread. `fresh`: read it."""
        cache = self._kubelet_file()
        hit = None if fresh else cache.cached()
        return hit if hit is not None else await self.state.run_io(cache.read, fresh)

    def _kubelet_file(self) -> KubeletCheckpointCache:
        if self._kubelet.path != Path(self.config.kubelet_checkpoint):  # the configuration names another file
            self._kubelet = KubeletCheckpointCache(self.config.kubelet_checkpoint)
        return self._kubelet

    async def _kubelet_checkpoint_or_none(self) -> KubeletCheckpoint | None:
        try:
            return await self.kubelet_checkpoint()
        except KubeletCheckpointError as e:
            log.warning("kubelet checkpoint unreadable (%s): guessing from the ledger alone", e)
            return None

    def _kubelet_stamp(self) -> Stamp | None:
        return self._kubelet_file().stamp()


    # -- device IDs ---------------------------------------------------------------------------------------------
    def _check_advertised(self, device_ids: list[str], kind: str) -> None:
        advertised = self._advertised[kind]
        bad = [d for d in device_ids if d not in advertised]
        if bad:
            raise PluginError.invalid(f"{bad[0]!r} was never advertised by this plugin "
                                      f"({len(bad)} such device ID(s) in the request)")

    def _check_core_ids(self, device_ids: list[str]) -> tuple[tuple[int, ...], int]:
        if not device_ids:
            raise PluginError.invalid("no device IDs in the request")
        try:
            per_card = devids.cards_of(self.state.inventory, device_ids, "c")
        except devids.BadDeviceID as e:
            raise PluginError.invalid(str(e)) from None
        self._check_advertised(device_ids, "c")
        cores = len(device_ids)
        cards = tuple(sorted(per_card))
        if cores > 100 and cores % 100:
            raise PluginError.invalid(f"{cores} vcuda-core IDs: more than one card must be a multiple of 100")
        if cores >= 100 and any(n != 100 for n in per_card.values()):
            raise PluginError.invalid(
                f"{cores} vcuda-core IDs must be whole cards (100 IDs each); got {dict(sorted(per_card.items()))}")
        if cores < 100 and len(cards) != 1:
            raise PluginError.invalid(f"{cores} vcuda-core IDs span cards {list(cards)}; a share must be on one card")
        return cards, cores

    # -- who asks, who holds ------------------------------------------------------------------------------------
    async def _visible_candidates(self, cores: int, ckpt: KubeletCheckpoint | None) -> list[binding.Candidate]:
        """Pending pods asking `cores`, after giving a pod bound a moment ago the time to reach the watch (and
        listing pods live once if it has not)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            cands = binding.candidates(self.pods.pods(), self.state.inventory, cores, self._taken(ckpt))
            if cands or loop.time() - start > WATCH_LAG_S:
                break
            await asyncio.sleep(0.01)
        if not cands:
            await self._refresh_quietly()
            cands = binding.candidates(self.pods.pods(), self.state.inventory, cores, self._taken(ckpt))
        return cands

    def _taken(self, ckpt: KubeletCheckpoint | None = None) -> set[tuple[str, str]]:
        """Containers that already hold devices: those the kubelet records, verified ones, and guesses that were
        certain (a guess among several pods names none of them for sure)."""
        out = set()
        recorded = set()
        for e in ckpt.entries if ckpt is not None else ():
            if e.resource_name == podspec.RESOURCE_CORE:
                pod = self.pods.get(e.pod_uid)
                out.add((str(pod["metadata"]["uid"]) if pod else e.pod_uid, e.container_name))
                recorded.add(allocation_key(e.device_ids))
        for a in self.state.ledger.allocations.values():
            if a.verified or (a.guess_of is None and a.key not in recorded):
                out.add(identity(a))  # (where the kubelet names the holder, its word counts, not the guess)
        return out

    def _allocation_for(self, cand: binding.Candidate, cards: tuple[int, ...], key: str,
                        verified: bool = False, ids: list[str] | None = None) -> Allocation:
        return allocation_for(cand, cards, key, self.state.memory_unit_mib, verified, ids)

    def _without(self, dead: list[Allocation]) -> Ledger:
        trial = self.state.ledger.copy()
        for d in dead:
            trial.release(d.key)
        return trial

    def _holders_on(self, cards: tuple[int, ...] | None, skip: list[Allocation]) -> list[Allocation]:
        """Allocations on these cards (None: on any), except `skip`."""
        gone = {d.key for d in skip}
        return [a for a in self.state.ledger.allocations.values()
                if a.key not in gone and (cards is None or set(a.cards) & set(cards))]

    async def _dead_holders(self, allocs: list[Allocation], ckpt: KubeletCheckpoint | None) -> list[Allocation]:
        """Of `allocs`, those the kubelet does not record and whose pod is gone or finished (from a fresh list):
        the kubelet's word decides, so their devices are free. DRA claims are never judged here."""
        if ckpt is None:
            return []
        recorded = {allocation_key(e.device_ids) for e in ckpt.entries if e.resource_name == podspec.RESOURCE_CORE}
        now = time.time()
        maybe = [a for a in allocs if not is_claim(a) and a.key not in recorded
                 and (a.pod_uid or now - (a.created or 0) > NAMELESS_GRACE_S)]
        if not maybe:
            return []
        return await gone(self.pods, [(a, a.pod_uid) for a in maybe])

    # -- helpers --------------------------------------------------------------------------------------------
    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._annotate_tasks.add(task)
        task.add_done_callback(self._annotate_tasks.discard)

    async def _refresh_quietly(self, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(self.pods.refresh(), timeout)
        except Exception as e:  # noqa: BLE001
            log.warning("listing pods failed: %s", e)

    def _observe(self, t0: float, ok: bool, reason: str = "") -> None:
        if self.events is not None:
            self.events.observe_allocate(time.perf_counter() - t0, ok, reason)


def holder_names(a: Allocation) -> tuple[str, str, str]:
    """(namespace, pod, container) for logs, `?` where not known."""
    return a.namespace or "?", a.pod or "?", a.container or "?"


def identity(a: Allocation) -> tuple[str, str]:
    return a.pod_uid, a.container
