"""What the two device plugins do, on the node state: device lists, preferred IDs, Allocate, PreStartContainer.

Allocate (vcuda-core) takes the cards named by the kubelet's IDs into the ledger under a key made from those IDs,
with the memory of the pod it guesses (see binding.py), and answers with the mounts of that key's vDevice
directory. PreStartContainer reads the kubelet checkpoint for the exact owner, repairs a wrong guess, writes the
container's limits and starts its vDevice server. vcuda-memory IDs are capacity tokens: the card comes from
vcuda-core, the amount from the pod spec. Settling guesses the kubelet has named, and failing a pod that can never
fit, are in settle.py; the ledger, limits and vDevice servers are the node core's (gpumgr/node/).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from gpumgr import binding, podspec, vdriver
from gpumgr.agent import guess
from gpumgr.agent.errors import PluginError
from gpumgr.agent.gone import gone
from gpumgr.agent.kubelet_cache import KubeletCheckpointCache, Stamp
from gpumgr.agent.settle import Settling, identity
from gpumgr.agent.truth import apply_truths
from gpumgr.allocator import Allocation, InvalidRequest, Ledger, LedgerError, NoFit, Request, choose
from gpumgr.choices import NO_CORDON, Cordon
from gpumgr.deviceplugin import ids as devids
from gpumgr.deviceplugin import response
from gpumgr.kubelet_checkpoint import KubeletCheckpoint, KubeletCheckpointError, find_owners
from gpumgr.node.claims import is_claim
from gpumgr.node.limits import LimitsMemo
from gpumgr.node.owner import allocation_for
from gpumgr.node.state import NodeState
from gpumgr.node.vdevices import start_server
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.vdevice.layout import VDeviceLayout, allocation_key
from gpumgr.vdevice.server import VDeviceManager

log = logging.getLogger("gpumgr.agent")

CANDIDATE_WAIT_S = 5.0  # how long Allocate waits for the pending pod to show up in the API
WATCH_LAG_S = 0.3  # how long Allocate waits for the pod watch before listing pods live
OWNER_WAIT_S = 3.0  # how long PreStart waits for the kubelet checkpoint to name the owner
PRESTART_LIST_S = 10.0  # how long PreStart waits for a live pod list (its whole work stays well under 30 s)
MEMORY_HINT_S = 10.0  # a vcuda-memory Allocate tells the next vcuda-core Allocate its memory for this long
NAMELESS_GRACE_S = 5.0  # an allocation made for no known pod is not judged dead before this age


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]: ...
    def get(self, uid: str) -> dict[str, Any] | None: ...
    async def refresh(self) -> None: ...
    async def live_uids(self) -> set[str] | None: ...
    def known_finished(self, uid: str) -> bool: ...


class Annotator(Protocol):
    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> bool:
        ...

    async def record_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        ...

    async def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        ...


class Events(Protocol):
    def observe_allocate(self, seconds: float, ok: bool, reason: str = "") -> None: ...


class AllocationService(Settling):
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

    # -- ListAndWatch ---------------------------------------------------------------------------------------
    def devices(self, kind: str) -> list[pb.Device]:
        table = self._core_ids if kind == "c" else self._mem_ids
        out = []
        for g in self.state.inventory.gpus:
            health = "Healthy" if self.state.healthy(g.index) else "Unhealthy"
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=g.numa_node)]) if g.numa_node is not None else None
            for d in table[g.index]:
                out.append(pb.Device(ID=d, health=health, topology=topo))
        return out

    # -- GetPreferredAllocation -----------------------------------------------------------------------------
    async def preferred(self, kind: str, req: pb.ContainerPreferredAllocationRequest) -> list[str]:
        inv = self.state.inventory
        size = int(req.allocation_size)
        if size <= 0:
            raise PluginError.invalid(f"allocation_size must be positive, got {size}")
        available = list(req.available_deviceIDs)
        must = list(req.must_include_deviceIDs)
        try:
            per_card = self._group(available, kind)
            must_cards = sorted(devids.cards_of(inv, must, kind))
        except devids.BadDeviceID as e:
            raise PluginError.invalid(str(e)) from None
        self._check_advertised(must, kind)
        cards = await self._planned_cards(kind, size)
        if must_cards:  # devices reused from an init container: stay on their card(s) first
            cards = tuple(must_cards) + tuple(c for c in (cards or ()) if c not in must_cards)
        chosen = list(must)
        taken = set(chosen)
        if cards is not None:
            need = size - len(chosen)
            pool = [d for c in cards for d in per_card.get(c, []) if d not in taken]
            if kind == "c" and size >= 100 and len(pool) < need:
                pool = []  # whole cards or nothing
            chosen += pool[:need]
            taken.update(pool[:need])
        if len(chosen) < size:  # the kubelet's view differs from ours: fill from what it offers
            rest = [d for d in sorted(available) if d not in taken]
            chosen += rest[: size - len(chosen)]
        return chosen[:size]

    def _group(self, device_ids: list[str], kind: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        advertised = self._advertised[kind]
        for d in device_ids:
            index = advertised.get(d)
            if index is None:
                raise devids.BadDeviceID(f"{d!r} is not a device of this plugin on this node")
            out.setdefault(index, []).append(d)
        return out

    def _check_advertised(self, device_ids: list[str], kind: str) -> None:
        advertised = self._advertised[kind]
        bad = [d for d in device_ids if d not in advertised]
        if bad:
            raise PluginError.invalid(f"{bad[0]!r} was never advertised by this plugin "
                                      f"({len(bad)} such device ID(s) in the request)")

    async def _planned_cards(self, kind: str, size: int) -> tuple[int, ...] | None:
        """Cards on which every pending pod the kubelet could be admitting fits (see guess.py)."""
        if kind == "c":
            ckpt = await self._kubelet_checkpoint_or_none()
            await self._settle(ckpt)
            ledger = self.state.ledger  # after settling (a commit replaces the ledger)
            cands = await self._visible_candidates(size, ckpt)
            cordon = self.cordon()
            if not cands:
                try:
                    return choose(self.state.topology, ledger,
                                  Request(size, self.state.memory_unit_mib if size < 100 else 0),
                                  frozenset(range(len(ledger))) - cordon.cards if cordon.cards else None).cards
                except (InvalidRequest, NoFit):
                    return None
            planned = guess.plan(self.state.topology, ledger, cands, self.state.memory_unit_mib,
                                 self.state.inventory.gpus, cordon)
            if planned.cards is None or len(planned.possible) < len(cands):
                dead = await self._dead_holders(self._holders_on(None, skip=[]), ckpt)
                if dead:  # gone pods' holdings, freed when the kubelet hands out their devices: plan without them
                    planned = guess.plan(self.state.topology, self._without(dead), cands, self.state.memory_unit_mib,
                                         self.state.inventory.gpus, cordon)
            return planned.cards
        # vcuda-memory: the card of the container's vcuda-core allocation, when it was made first
        for a in reversed(list(self.state.ledger.allocations.values())):
            h = a.container_holder
            if not a.verified and a.cores < 100 and h is not None and h.memory_units == size:
                return a.cards
        return None

    # -- Allocate -------------------------------------------------------------------------------------------
    async def allocate_core(self, device_ids: list[str]) -> tuple[pb.ContainerAllocateResponse, bool]:
        """The container's answer, and whether this call created the allocation (False: the kubelet asked again
        for IDs already held, and got the same answer)."""
        t0 = time.perf_counter()
        try:
            resp, created = await self._allocate_core(device_ids)
        except PluginError as e:
            self._observe(t0, False, e.reason)
            raise
        self._observe(t0, True)
        return resp, created

    async def _allocate_core(self, device_ids: list[str]) -> tuple[pb.ContainerAllocateResponse, bool]:
        cards, cores = self._check_core_ids(device_ids)
        key = allocation_key(device_ids)
        ckpt = await self._kubelet_checkpoint_or_none()
        await self._settle(ckpt)
        hint = self._take_memory_hint()  # in every path: a hint left unused would be taken by the next container
        existing = self.state.ledger.held_by(key)
        dead: list[Allocation] = []
        if existing is not None:
            dead = await self._dead_holders([existing], ckpt)
            if not dead:
                app = self._app_reusing(existing, ckpt, cores)
                if app is None:  # the kubelet asking again for the same IDs: same answer, minus an unconfirmed
                    return self._response(_unconfirmed(existing)), False  # memory (it may be another pod's)
                return await self._hand_on(existing, app), False
        shim = vdriver.shim_path(Path(self.config.response.shim_dir))
        if cores < 100 and not shim.is_file():
            raise PluginError.precondition(f"the vCUDA shim is not installed at {shim}: a fractional container "
                                           "would run with no limits (check --shim-source)", "no_shim")
        cands = await self._guess_candidates(cores, ckpt)
        unit = self.state.memory_unit_mib
        verdict: guess.Verdict | None = None
        reused = self._reuse_base(set(device_ids), dead)
        if reused is not None:  # IDs of the pod's init container: it is that pod, and it needs the larger of the two
            dead = [*dead, reused]  # judged as if free (the change below records both in one reservation)
            cands = [c for c in cands if c.uid == reused.pod_uid] or cands
        if cands:
            trial = self._without(dead)
            verdict = guess.judge(self.state.topology, trial, cands, cards, unit)
            if not verdict.safe or verdict.fit_nowhere:  # the ledger may still count holders the kubelet let go
                more = await self._dead_holders(self._holders_on(None, skip=dead), ckpt)
                if more:
                    dead += more
                    trial = self._without(dead)
                    verdict = guess.judge(self.state.topology, trial, cands, cards, unit)
            if not verdict.here:
                problem = trial.problem(self._allocation_for(cands[0], cards, "\x00probe"))
                raise PluginError.exhausted(
                    f"no pending pod asking vcuda-core={cores} fits on cards {list(cards)} ({problem}); the "
                    "kubelet's view of free devices differs from the agent's")
            if not verdict.safe:
                self.unsafe_refusals += 1
                names = ", ".join(f"{c.namespace}/{c.name}" for c in verdict.stranded_if_chosen[:5])
                log.warning("allocate: refused cards %s for vcuda-core=%d: the kubelet may be admitting %s, which "
                            "would not fit there (refusals so far: %d)", list(cards), cores, names,
                            self.unsafe_refusals)
                raise PluginError.precondition(
                    f"cards {list(cards)} cannot hold every pending pod asking vcuda-core={cores} (not {names}); "
                    "refusing rather than starting a pod that could not fit: its owner will recreate it",
                    "unsafe_guess")
        named = self._narrow_by_memory(list(verdict.here), units=hint) if verdict else []
        cand = binding.pick(named, cards) if verdict else None
        if cand is None and cores < 100:
            raise PluginError.precondition(
                f"no pending pod on node {self.state.node_name} asks vcuda-core={cores}; cannot tell how much memory "
                "to give (is the pod bound to this node and visible to the agent?)", "no_pod")
        if cand is not None and verdict is not None:
            alloc = self._allocation_for(cand, cards, key, ids=device_ids)
            certain = verdict.certain_memory_mib(unit)
            if hint is not None and any(c.ask.memory_units == hint for c in verdict.here):
                certain = guess.memory_of(cand, unit)  # its vcuda-memory Allocate said how much
            alloc = replace(alloc, memory_mib=verdict.reserve_mib(unit) if cores < 100 else 0,
                            answered_memory_mib=certain,
                            guess_of=len(verdict.here) if len(verdict.here) > 1 else None)
        else:
            alloc = Allocation(key=key, cards=cards, cores=cores, memory_mib=0, created=int(time.time()))
        if reused is not None:
            dead.remove(reused)
        change = self._with_reuse(alloc, set(device_ids), dead)
        try:
            await self.state.run_io(self.layout.prepare, key)  # the mount must exist before anyone is answered
            await self.state.commit(change)
        except LedgerError as e:
            raise PluginError.exhausted(f"cannot allocate cards {list(cards)}: {e}") from None
        except OSError as e:
            raise PluginError.precondition(f"cannot record the allocation, nothing allocated: {e}", "checkpoint") \
                from None
        for d in dead:  # its server goes; the directory stays when the new allocation has the same key
            await self.vdevices.stop(d.key, remove_dir=d.key != key)
            log.info("allocate: freed cards %s of %s/%s container %s (key %s): the kubelet no longer records it "
                     "and its pod is gone or finished", list(d.cards), *_names(d), d.key)
        log.info("allocate: cards %s cores %d memory %d MiB key %s for %s/%s container %s (guess among %d)",
                 list(cards), cores, alloc.memory_mib, key, *_names(alloc), len(verdict.here) if verdict else 0)
        return self._response(alloc), True

    def _app_reusing(self, existing: Allocation, ckpt: KubeletCheckpoint | None, cores: int) -> Allocation | None:
        """When the kubelet hands exactly an init container's IDs (which its checkpoint records for that init
        container) to an app container of the same pod: the app container's allocation under the same key."""
        if not existing.is_init or ckpt is None:
            return None
        pod = self.pods.get(existing.pod_uid)
        if pod is None:
            return None
        inits = {c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []}
        named = [e for e in ckpt.entries if e.resource_name == podspec.RESOURCE_CORE
                 and allocation_key(e.device_ids) == existing.key]
        if not named or any(e.container_name not in inits for e in named):
            return None
        apps = [a for a in podspec.gpu_containers(pod) if a.cores == cores
                and (str(pod["metadata"]["uid"]), a.name) not in self._taken(ckpt)]
        if not apps:
            return None
        alloc = self._allocation_for(binding.Candidate(pod, apps[0], None, ()), existing.cards, existing.key)
        return replace(alloc, answered_memory_mib=alloc.memory_mib)

    async def _hand_on(self, init: Allocation, app: Allocation) -> pb.ContainerAllocateResponse:
        def change(ledger: Ledger) -> None:
            if ledger.held_by(init.key) != init:
                raise LedgerError(f"{init.key} changed while being handed on")
            ledger.release(init.key)
            ledger.assign(app)

        try:
            await self.state.commit(change)
        except LedgerError as e:
            raise PluginError.exhausted(f"cannot hand cards {list(init.cards)} on to {app.pod} container "
                                        f"{app.container}: {e}") from None
        log.info("allocate: %s/%s container %s takes over the devices of init container %s (key %s)",
                 app.namespace, app.pod, app.container, init.container, init.key)
        return self._response(app)

    def allocate_memory(self, device_ids: list[str]) -> pb.ContainerAllocateResponse:
        try:
            devids.cards_of(self.state.inventory, device_ids, "m")
        except devids.BadDeviceID as e:
            raise PluginError.invalid(str(e)) from None
        if not device_ids:
            raise PluginError.invalid("no device IDs in the request")
        self._check_advertised(device_ids, "m")
        stamp = self._kubelet_stamp()
        if self._open_core is not False and self._open_core == stamp:  # core came first: same container's memory
            self._memory_hint = None
        else:  # memory first: the next core Allocate is for a container asking this much
            self._memory_hint = (time.monotonic(), len(device_ids), stamp)
        self._open_core = False
        return pb.ContainerAllocateResponse()

    def _take_memory_hint(self) -> int | None:
        hint, self._memory_hint = self._memory_hint, None
        stamp = self._kubelet_stamp()
        self._open_core = stamp if hint is None else False
        if hint is None or time.monotonic() - hint[0] > MEMORY_HINT_S or hint[2] != stamp:
            return None
        return hint[1]

    def _kubelet_stamp(self) -> Stamp | None:
        return self._kubelet_file().stamp()

    @staticmethod
    def _narrow_by_memory(cands: list[binding.Candidate], units: int | None) -> list[binding.Candidate]:
        """Only the candidates asking the memory the kubelet just allocated, when that is known (and any match).
        Used to name the owner and its memory, never to decide what is safe or what to reserve."""
        if units is None:
            return cands
        same = [c for c in cands if c.ask.memory_units == units]
        return same or cands

    def _reuse_base(self, ids: set[str], dead: list[Allocation]) -> Allocation | None:
        """The reserving allocation of an init container whose devices the kubelet hands on (same pod)."""
        gone = {d.key for d in dead}
        return next((a for a in self.state.ledger.allocations.values()
                     if a.key not in gone and a.reserve and a.ids and ids & set(a.ids)), None)

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

    async def _kubelet_checkpoint_or_none(self) -> KubeletCheckpoint | None:
        try:
            return await self.kubelet_checkpoint()
        except KubeletCheckpointError as e:
            log.warning("kubelet checkpoint unreadable (%s): guessing from the ledger alone", e)
            return None

    def _with_reuse(self, alloc: Allocation, ids: set[str], dead: list[Allocation]) -> Callable[[Ledger], None]:
        """How to record `alloc` (after freeing `dead`, the holders the kubelet has let go). The kubelet hands an
        app container devices its pod's init container already holds (all of them plus more, or some of them):
        the pod then needs the larger of the two on those cards, not the sum. The larger reserves, with the memory
        of both; the other rides on it."""
        gone = {d.key: d for d in dead}

        def free_dead(ledger: Ledger) -> None:
            for k, d in gone.items():
                if ledger.held_by(k) == d:
                    ledger.release(k)

        base = self._reuse_base(ids, dead)
        if base is None:
            def plain(ledger: Ledger) -> None:
                free_dead(ledger)
                ledger.assign(alloc)

            return plain
        old = set(base.ids)
        if ids >= old:
            primary = replace(alloc, memory_mib=max(alloc.memory_mib, base.memory_mib) if alloc.cores < 100 else 0)
            rider = replace(base, reserve=False, rides_on=alloc.key)
        elif ids <= old:
            primary = replace(base, memory_mib=max(alloc.memory_mib, base.memory_mib) if base.cores < 100 else 0)
            rider = replace(alloc, reserve=False, rides_on=base.key)
        else:
            def partial(ledger: Ledger) -> None:
                free_dead(ledger)
                ledger.assign(alloc)

            return partial
        log.info("allocate: %s reuses the devices of %s (same pod): one reservation for both", alloc.key, base.key)

        def change(ledger: Ledger) -> None:
            free_dead(ledger)
            if ledger.held_by(base.key) != base:  # changed while we waited for the lock: record plainly
                ledger.assign(alloc)
                return
            ledger.release(base.key)
            ledger.assign(primary)
            ledger.assign(rider)

        return change

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

    async def _guess_candidates(self, cores: int, ckpt: KubeletCheckpoint | None) -> list[binding.Candidate]:
        """The pending containers this allocation could be for; waits up to CANDIDATE_WAIT_S for one to appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANDIDATE_WAIT_S
        cands = await self._visible_candidates(cores, ckpt)
        while not cands and loop.time() < deadline:  # (one live list was done: the watch delivers what follows)
            await asyncio.sleep(0.2)
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

    def _response(self, alloc: Allocation) -> pb.ContainerAllocateResponse:
        """The answer; its `tencent.com/vcuda-memory` annotation is the container's own memory when that is known
        for sure (whole cards, a verified owner, or every pod it could be asks the same), and absent otherwise:
        never another pod's value (docs/annotations.md)."""
        gpus = [self.state.inventory.gpus[c] for c in alloc.cards]
        known: int | None
        if alloc.cores >= 100:
            known = sum(g.memory_mib for g in gpus)
        elif alloc.answered_memory_mib is not None:
            known = alloc.answered_memory_mib
        elif alloc.verified and alloc.container_holder is not None and alloc.container_holder.memory_units is not None:
            known = alloc.container_holder.memory_units * self.state.memory_unit_mib
        else:
            known = None
        resp = response.build(self.config.response, gpus, alloc.cores, (known or 0) << 20,
                              self.layout.dir_for(alloc.key), alloc.key)
        if known is None:
            del resp.annotations[response.ANN_MEMORY]
        return resp

    # -- PreStartContainer ----------------------------------------------------------------------------------
    async def prestart_core(self, device_ids: list[str]) -> None:
        cards, cores = self._check_core_ids(device_ids)
        key = allocation_key(device_ids)
        uid, container, ckpt = await self._owner(device_ids)
        seen = dict(self.state.ledger.allocations)  # (as the checkpoint was read: only these may be evicted)
        pod = self.pods.get(uid)
        if pod is None:
            await self._refresh_quietly(PRESTART_LIST_S)
            pod = self.pods.get(uid)
        if pod is None:
            raise PluginError.precondition(f"pod {uid} (owner of these devices per the kubelet) is not on node "
                                           f"{self.state.node_name} in the API", "no_pod")
        meta = pod["metadata"]
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            self._failing.pop(uid, None)  # terminal: the phase refuses from now on
            raise PluginError.precondition(f"pod {meta.get('namespace')}/{meta.get('name')} "
                                           f"is {phase} ({(pod.get('status') or {}).get('message', '')}); its "
                                           "containers are not started", "finished")
        if uid in self._failing:  # decided before (its Failed status may not have been written): refuse again
            raise PluginError.precondition(f"pod {meta.get('namespace')}/{meta.get('name')} was failed at "
                                           f"PreStartContainer: {self._failing[uid]}", "failing")
        try:
            await self._verify(pod, container, cards, device_ids, key, ckpt, seen)
        except PluginError as e:
            if e.reason == "no_fit":  # it would fail at every retry: fail the pod so that its owner recreates it
                await self._fail_pod(pod, container, key, e.message)
            elif e.reason != "failing":  # (that one was told once, when the pod was failed)
                self._background(self._warn(pod, "GPUPreStartFailed", e.message))
            raise

    async def _verify(self, pod: Mapping[str, Any], container: str, cards: tuple[int, ...],
                      device_ids: list[str], key: str, ckpt: KubeletCheckpoint,
                      seen: Mapping[str, Allocation]) -> None:
        cores = len(device_ids)
        ask = binding.find_container(pod, container)
        if ask is None or ask.cores != cores:
            raise PluginError.precondition(
                f"pod {pod['metadata']['uid']} container {container} does not ask vcuda-core={cores} (asks "
                f"{ask.cores if ask else 0})", "mismatch")
        meta = pod["metadata"]
        uid = str(meta["uid"])
        cand = binding.Candidate(pod=pod, ask=ask, recorded=None, order=())
        first = self._allocation_for(cand, cards, key, verified=True, ids=device_ids)
        truth = self._verified(self.state.ledger, first)
        current = self.state.ledger.held_by(key)
        if current != truth:
            if current is not None and identity(current) != identity(truth):
                log.warning("prestart: allocation %s was guessed for %s/%s container %s; the kubelet says %s/%s "
                            "container %s: repaired before any limit was written", key, current.namespace,
                            current.pod, current.container, meta.get("namespace"),
                            meta.get("name"), container)
            recorded = {allocation_key(e.device_ids) for e in ckpt.entries if e.resource_name == podspec.RESOURCE_CORE}
            made: list[Allocation] = []

            def repair(ledger: Ledger) -> None:
                # decided on the ledger being changed, not on the one read before waiting for the lock
                want = self._verified(ledger, first)
                made[:] = [want]
                if ledger.held_by(key) == want:
                    return
                # the same checkpoint also names the owners of the other guesses: correct them in the same step,
                # so that two swapped guesses on a full card repair each other
                conflicts = apply_truths(ledger, [want, *self._corrected_guesses(ckpt, key, ledger)], recorded,
                                         seen)
                if ledger.held_by(key) != want:
                    raise LedgerError(next((why for k, why in conflicts if k == key), "no room"))

            try:
                await self.state.commit(repair)
            except LedgerError as e:
                raise PluginError.precondition(f"pod {meta.get('namespace')}/{meta.get('name')} container "
                                               f"{container} does not fit on cards {list(cards)}: {e}",
                                               "no_fit") from None
            truth = made[0]
        await start_server(self.vdevices, self.state.inventory, key, self.limits.get(truth, pod), truth.cards)
        log.info("prestart: pod %s/%s container %s verified on cards %s (key %s)", meta.get("namespace"),
                 meta.get("name"), container, list(cards), key)
        self.schedule_annotations(uid)

    @staticmethod
    def _verified(ledger: Ledger, truth: Allocation) -> Allocation:
        """What `ledger` should hold for the verified container `truth`: when its guess was right, the guess keeps
        its reservation if a reusing container rides on it, else shrinks what was reserved for the other pods it
        could have been to the container's own ask; marked verified."""
        current = ledger.held_by(truth.key)
        if current is None or identity(current) != identity(truth):
            return truth
        riders = [a.memory_mib for a in ledger.allocations.values() if a.rides_on == truth.key]
        memory = max([truth.memory_mib, *riders]) if current.reserve and truth.cores < 100 else current.memory_mib
        return replace(current, memory_mib=memory, guess_of=None, verified=True)

    def _corrected_guesses(self, ckpt: KubeletCheckpoint, skip: str, ledger: Ledger) -> list[Allocation]:
        """Unverified allocations whose owner, per the kubelet checkpoint, is not the pod guessed at Allocate."""
        out = []
        for e in ckpt.entries:
            if e.resource_name != podspec.RESOURCE_CORE:
                continue
            k = allocation_key(e.device_ids)
            have = ledger.held_by(k)
            if k == skip or have is None or have.verified:
                continue
            pod = self.pods.get(e.pod_uid)
            if identity(have) == (str((pod or {}).get("metadata", {}).get("uid", e.pod_uid)), e.container_name):
                continue
            ask = binding.find_container(pod, e.container_name) if pod else None
            if pod is None or ask is None or ask.cores != have.cores:
                continue
            out.append(self._allocation_for(binding.Candidate(pod, ask, None, ()), have.cards, k,
                                            ids=list(e.device_ids)))
        return out

    async def _owner(self, device_ids: list[str]) -> tuple[str, str, KubeletCheckpoint]:
        path = self.config.kubelet_checkpoint
        deadline = time.monotonic() + OWNER_WAIT_S
        missed = False
        while True:
            try:
                # after a miss, past the cache: a write the stamp cannot show (see kubelet_cache.py) is read
                ckpt = await self.kubelet_checkpoint(fresh=missed)
            except KubeletCheckpointError as e:
                raise PluginError.precondition(f"cannot read the kubelet checkpoint: {e}", "kubelet_checkpoint") \
                    from None
            owners = find_owners(ckpt.entries, podspec.RESOURCE_CORE, device_ids)
            if owners:
                uid, name = binding.app_owner(owners, self.pods.get(owners[0][0]))
                return uid, name, ckpt
            missed = True
            if time.monotonic() > deadline:
                raise PluginError.precondition(
                    f"the kubelet checkpoint {path} names no container holding these {len(device_ids)} vcuda-core "
                    "IDs; refusing to write limits for an unverified container", "unverified")
            await asyncio.sleep(0.1)

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

    # -- pod annotations ------------------------------------------------------------------------------------
    def schedule_annotations(self, uid: str) -> None:
        if self.annotator is not None:
            self._background(self._annotate(uid))

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._annotate_tasks.add(task)
        task.add_done_callback(self._annotate_tasks.discard)

    async def _warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        if self.annotator is not None:
            async with self._api_slots:
                await self.annotator.record_event(pod, reason, message)

    async def _annotate(self, uid: str) -> None:
        pod = self.pods.get(uid)
        if pod is None or self.annotator is None:
            return
        mine = [(h.container_index, a) for a in self.state.ledger.allocations.values()
                if (h := a.container_holder) is not None and h.pod_uid == uid and a.verified and not h.init]
        inv = self.state.inventory
        ann: dict[str, str | None] = {
            f"{podspec.ANN_PREDICATE_IDX}{index}": ",".join(str(inv.gpus[c].minor) for c in a.cards)
            for index, a in mine
        }
        wanted = {(ask.index) for ask in podspec.gpu_containers(pod)}
        done = {index for index, _ in mine}
        if wanted <= done:
            ann[podspec.ANN_ASSIGNED] = "true"
        meta = pod["metadata"]
        for attempt in range(5):
            try:
                async with self._api_slots:
                    await self.annotator.patch_pod_annotations(meta.get("namespace", "default"), meta["name"], ann)
                return
            except Exception as e:  # noqa: BLE001 - retried, then logged
                log.warning("annotating pod %s/%s failed (attempt %d): %s", meta.get("namespace"), meta.get("name"),
                            attempt + 1, e)
                await asyncio.sleep(0.2 * 2 ** attempt)

    async def drain(self) -> None:
        """Wait for pending annotation patches (tests, shutdown)."""
        if self._annotate_tasks:
            await asyncio.gather(*list(self._annotate_tasks), return_exceptions=True)

    # -- releasing ------------------------------------------------------------------------------------------
    async def release(self, keys: list[str], why: str, unverified_only: bool = False,
                      expect: Mapping[str, Allocation] | None = None) -> list[Allocation]:
        """Free allocations (one checkpoint write) and stop their vDevice servers. `unverified_only`: never free a
        verified one (a started container's), and a container riding on a freed reservation reserves again.
        `expect`: the allocations the decision was made on; a key whose holder has changed since is left alone."""
        held = [k for k in keys if self.state.ledger.held_by(k) is not None]
        if not held:
            return []

        def free(ledger: Ledger) -> list[Allocation]:
            out = []
            for k in held:
                a = ledger.held_by(k)
                if a is None or (unverified_only and a.verified) \
                        or (expect is not None and expect.get(k) != a):
                    continue
                ledger.release(k)
                out.append(a)
            if unverified_only:
                _reserve_again(ledger, {a.key for a in out})
            return out

        freed: list[Allocation] = await self.state.commit(free)
        for a in freed:
            await self.vdevices.stop(a.key)
            log.info("released cards %s of %s/%s container %s (key %s): %s", list(a.cards), *_names(a), a.key, why)
        return freed

    async def release_ids(self, device_ids: list[str]) -> None:
        await self.release([allocation_key(device_ids)], "rolled back with the rest of its Allocate call")

    # -- helpers --------------------------------------------------------------------------------------------
    async def _refresh_quietly(self, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(self.pods.refresh(), timeout)
        except Exception as e:  # noqa: BLE001
            log.warning("listing pods failed: %s", e)

    def _observe(self, t0: float, ok: bool, reason: str = "") -> None:
        if self.events is not None:
            self.events.observe_allocate(time.perf_counter() - t0, ok, reason)


def _unconfirmed(a: Allocation) -> Allocation:
    """`a` without the memory its first answer named, unless a PreStart verified its owner."""
    if a.verified or a.answered_memory_mib is None:
        return a
    return replace(a, answered_memory_mib=None)


def _reserve_again(ledger: Ledger, freed: set[str]) -> None:
    """Containers that rode on a freed reservation reserve their own memory again (it fits: the freed one
    reserved at least as much on the same cards)."""
    for r in list(ledger.allocations.values()):
        if not r.reserve and r.rides_on in freed:
            ledger.release(r.key)
            alone = replace(r, reserve=True, rides_on=None)
            try:
                ledger.assign(alone, check_health=False)
            except LedgerError:
                ledger.assign(r, check_health=False)


def _names(a: Allocation) -> tuple[str, str, str]:
    """(namespace, pod, container) for logs, `?` where not known."""
    return a.namespace or "?", a.pod or "?", a.container or "?"


@dataclass(frozen=True)
class ServiceConfig:
    kubelet_checkpoint: Path
    response: response.ResponseConfig
