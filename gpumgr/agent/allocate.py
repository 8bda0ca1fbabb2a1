"""Allocate for the two device plugins. vcuda-core takes the cards named by the kubelet's IDs into the ledger under a
key made from those IDs, with the memory of the pod it guesses (see node/binding.py and guess.py), and answers with the
mounts of that key's vDevice directory; an app container handed its init container's IDs takes them over or rides
on their reservation. vcuda-memory IDs are capacity tokens: the card comes from vcuda-core, the amount from the pod
spec; a memory Allocate that comes first tells the next core Allocate how much its container asks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpumgr.agent import guess
from gpumgr.agent.base import holder_names
from gpumgr.agent.errors import PluginError
from gpumgr.agent.settle import Settling
from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.deviceplugin import ids as devids
from gpumgr.deviceplugin import response
from gpumgr.node import binding
from gpumgr.node.kubelet_checkpoint import KubeletCheckpoint
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.requests import podspec
from gpumgr.vdevice import vdriver
from gpumgr.vdevice.layout import allocation_key

log = logging.getLogger("gpumgr.agent")

CANDIDATE_WAIT_S = 5.0  # how long Allocate waits for the pending pod to show up in the API
MEMORY_HINT_S = 10.0  # a vcuda-memory Allocate tells the next vcuda-core Allocate its memory for this long


class Allocating(Settling):
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
                     "and its pod is gone or finished", list(d.cards), *holder_names(d), d.key)
        log.info("allocate: cards %s cores %d memory %d MiB key %s for %s/%s container %s (guess among %d)",
                 list(cards), cores, alloc.memory_mib, key, *holder_names(alloc), len(verdict.here) if verdict else 0)
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

    async def _guess_candidates(self, cores: int, ckpt: KubeletCheckpoint | None) -> list[binding.Candidate]:
        """The pending containers this allocation could be for; waits up to CANDIDATE_WAIT_S for one to appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANDIDATE_WAIT_S
        cands = await self._visible_candidates(cores, ckpt)
        while not cands and loop.time() < deadline:  # (one live list was done: the watch delivers what follows)
            await asyncio.sleep(0.2)
            cands = binding.candidates(self.pods.pods(), self.state.inventory, cores, self._taken(ckpt))
        return cands

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


def _unconfirmed(a: Allocation) -> Allocation:
    """`a` without the memory its first answer named, unless a PreStart verified its owner."""
    if a.verified or a.answered_memory_mib is None:
        return a
    return replace(a, answered_memory_mib=None)
