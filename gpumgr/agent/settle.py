"""Settling guesses as soon as the kubelet names their owners: part of the device-plugin front end's
`AllocationService`, kept apart from the plugin calls themselves.

The kubelet writes its checkpoint once a container's resources are allocated, usually long before the container
starts; every GetPreferredAllocation and Allocate settles the guesses it names (see docs/architecture.md). A
container the kubelet admitted where it cannot run has its pod failed (podwrites.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gpumgr.agent.base import identity
from gpumgr.agent.podwrites import PodWrites
from gpumgr.agent.truth import apply_truths
from gpumgr.allocator import Allocation, Ledger
from gpumgr.node import binding
from gpumgr.node.claims import is_claim
from gpumgr.node.kubelet_checkpoint import KubeletCheckpoint
from gpumgr.requests import podspec
from gpumgr.vdevice.layout import allocation_key

log = logging.getLogger("gpumgr.agent")


class Settling(PodWrites):
    """Settles the guesses the kubelet checkpoint names the owner of."""

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
