"""Settling guesses as soon as the kubelet names their owners, and failing a pod that can never fit: part of the
device-plugin front end's `AllocationService` (a mixin of it), kept apart from the plugin calls themselves.

The kubelet writes its checkpoint once a container's resources are allocated, usually long before the container
starts; every GetPreferredAllocation and Allocate settles the guesses it names (see docs/architecture.md). A
container the kubelet admitted where it cannot run has its pod failed, at settling or at PreStartContainer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpumgr import binding, podspec
from gpumgr.agent.truth import apply_truths
from gpumgr.allocator import Allocation, Ledger
from gpumgr.kubelet_checkpoint import KubeletCheckpoint
from gpumgr.node.claims import is_claim
from gpumgr.vdevice.layout import allocation_key

if TYPE_CHECKING:
    from gpumgr.agent.service import Annotator, PodSource
    from gpumgr.node.state import NodeState
    from gpumgr.vdevice.server import VDeviceManager

log = logging.getLogger("gpumgr.agent")

FAIL_ATTEMPTS, FAIL_RETRY_S = 4, 0.5  # marking a pod Failed: attempts, and the first pause between them
FAILING_KEPT = 1024  # pods decided to fail at PreStart that are remembered (their later PreStarts are refused)
FAIL_REASON = "GPUAllocationUnfit"  # pod condition and event reason when a pod is failed at PreStart


class Settling:
    """What `AllocationService` settles and fails; it provides the state and the helpers declared here."""

    state: NodeState
    pods: PodSource
    vdevices: VDeviceManager
    annotator: Annotator | None
    prestart_failures: int  # pods failed because they could not be made to fit
    _failing: OrderedDict[str, str]  # uid -> why, of pods failed (their later PreStarts are refused)
    _api_slots: asyncio.Semaphore

    if TYPE_CHECKING:
        async def _dead_holders(self, allocs: list[Allocation], ckpt: KubeletCheckpoint | None) \
            -> list[Allocation]: ...

        def _holders_on(self, cards: tuple[int, ...] | None, skip: list[Allocation]) -> list[Allocation]: ...

        def _allocation_for(self, cand: binding.Candidate, cards: tuple[int, ...], key: str,
                            verified: bool = False, ids: list[str] | None = None) -> Allocation: ...

        async def release(self, keys: list[str], why: str, unverified_only: bool = False,
                          expect: Mapping[str, Allocation] | None = None) -> list[Allocation]: ...

        def _background(self, coro: Any) -> None: ...

    async def _settle(self, ckpt: KubeletCheckpoint | None) -> None:
        """Guesses the kubelet checkpoint already names the owner of (admitted, not yet started) take that owner
        and its own memory now, so that what they reserved for the other pods they could have been is free for
        the next admission. They stay unverified until their PreStartContainer. What to change is decided on the
        ledger inside the commit (never on a snapshot a concurrent change may have made stale)."""
        if ckpt is None:
            return
        listed: dict[str, list[tuple[str, str]]] = {}
        for e in ckpt.entries:
            if e.resource_name == podspec.RESOURCE_CORE:
                listed.setdefault(allocation_key(e.device_ids), []).append((e.pod_uid, e.container_name))
        recorded = set(listed)
        seen = dict(self.state.ledger.allocations)  # (as the checkpoint was read: only these may be evicted)
        planned = self._settle_truths(self.state.ledger, ckpt, listed)
        if not planned:
            return  # nothing to settle: no checkpoint write
        dead: list[Allocation] = []
        if apply_truths(self.state.ledger.copy(), planned, recorded, seen):  # holders the kubelet let go may be
            dead = await self._dead_holders(self._holders_on(None, skip=[]), ckpt)  # in the way
        tried: list[Allocation] = []

        def settle(ledger: Ledger) -> list[tuple[str, str]]:
            for d in dead:  # holders the kubelet let go, of gone pods: their room is free before settling
                if ledger.held_by(d.key) == d:
                    ledger.release(d.key)
            tried[:] = self._settle_truths(ledger, ckpt, listed)
            return apply_truths(ledger, tried, recorded, seen)

        conflicts = await self.state.commit(settle)
        for d in dead:
            if self.state.ledger.held_by(d.key) is None:
                await self.vdevices.stop(d.key)
        log.info("allocate: the kubelet checkpoint names the owners of %d guessed allocation(s); settled (%d "
                 "conflicts)", len(tried), len(conflicts))
        by_key = {t.key: t for t in tried}
        for k, why in conflicts:
            # the kubelet admitted a container where it cannot run: fail its pod now rather than at its start
            t = by_key[k]
            pod = self.pods.get(t.pod_uid)
            if pod is not None:
                await self._fail_pod(pod, t.container or "?", t.key,
                                     f"does not fit on cards {list(t.cards)}: {why}")

    def _settle_truths(self, ledger: Ledger, ckpt: KubeletCheckpoint,
                       listed: dict[str, list[tuple[str, str]]]) -> list[Allocation]:
        """The owners the kubelet names for the unverified reserving guesses of `ledger`, with their own memory."""
        truths: list[Allocation] = []
        for k, owners in listed.items():
            have = ledger.held_by(k)
            if have is None or is_claim(have) or not have.reserve or have.verified:
                continue
            pod = self.pods.get(owners[0][0])
            if pod is None:
                continue
            _, cname = binding.app_owner(owners, pod)
            if identity(have) == (str(pod["metadata"]["uid"]), cname) and have.guess_of is None:
                continue
            ask = binding.find_container(pod, cname)
            if ask is None or ask.cores != have.cores:
                continue
            ids = next(e.device_ids for e in ckpt.entries if e.resource_name == podspec.RESOURCE_CORE
                       and allocation_key(e.device_ids) == k)
            truth = self._allocation_for(binding.Candidate(pod, ask, None, ()), have.cards, k, ids=list(ids))
            riders = [a.memory_mib for a in ledger.allocations.values() if a.rides_on == k]
            truths.append(replace(truth, memory_mib=max([truth.memory_mib, *riders]) if ask.cores < 100 else 0,
                                  answered_memory_mib=have.answered_memory_mib))
        return truths

    async def _fail_pod(self, pod: Mapping[str, Any], container: str, key: str, why: str) -> None:
        """A container that can never be given what it asks: the pod is marked Failed with a condition and an event
        that say why and what to do (in the background), its later PreStarts are refused, and what it holds that
        no started container uses is freed: `key` and the pod's other unverified allocations. Verified ones belong
        to containers that are running; reconcile frees them once the pod is really terminal."""
        self.prestart_failures += 1
        meta = pod["metadata"]
        uid = str(meta["uid"])
        message = (f"container {container}: {why}. The GPU share it was admitted with cannot hold it; delete the pod "
                   "(its controller recreates it) so that it is admitted again where it fits")
        log.error("prestart: failing pod %s/%s: %s (failures so far: %d)", meta.get("namespace"), meta.get("name"),
                  message, self.prestart_failures)
        self._failing[uid] = message
        while len(self._failing) > FAILING_KEPT:
            self._failing.popitem(last=False)
        mine = [a.key for a in self.state.ledger.allocations.values()
                if (a.pod_uid == uid or a.key == key) and not is_claim(a) and not a.verified]
        await self.release(mine, "its pod was failed at PreStartContainer", unverified_only=True)
        if self.annotator is not None:
            self._background(self._mark_failed(pod, message))

    async def _mark_failed(self, pod: Mapping[str, Any], message: str) -> None:
        """The event, then the Failed status (retried a few times: until it is written, the pod's containers that
        were started keep running and their shares stay held)."""
        meta = pod["metadata"]
        if self.annotator is None:
            return
        try:
            async with self._api_slots:
                await self.annotator.record_event(pod, FAIL_REASON, message)
        except Exception as e:  # noqa: BLE001 - the refusal still tells the kubelet
            log.warning("could not record the event of failing pod %s/%s: %s", meta.get("namespace"),
                        meta.get("name"), e)
        for attempt in range(FAIL_ATTEMPTS):
            try:
                async with self._api_slots:
                    await self.annotator.fail_pod(str(meta.get("namespace", "default")), str(meta["name"]),
                                                  FAIL_REASON, message)
                return
            except Exception as e:  # noqa: BLE001 - its PreStarts are refused all the same
                log.warning("could not mark pod %s/%s Failed (attempt %d of %d): %s", meta.get("namespace"),
                            meta.get("name"), attempt + 1, FAIL_ATTEMPTS, e)
            await asyncio.sleep(FAIL_RETRY_S * 2 ** attempt)


def identity(a: Allocation) -> tuple[str, str]:
    return a.pod_uid, a.container
