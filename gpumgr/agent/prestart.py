"""PreStartContainer for vcuda-core: the exact owner from the kubelet checkpoint, a wrong guess repaired (with the other
guesses the same checkpoint corrects) before any limit is written, then the container's limits and its vDevice
server; a container that cannot fit has its pod failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpumgr.agent.base import identity
from gpumgr.agent.errors import PluginError
from gpumgr.agent.settle import Settling
from gpumgr.agent.truth import apply_truths
from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.node import binding
from gpumgr.node.kubelet_checkpoint import KubeletCheckpoint, KubeletCheckpointError, find_owners
from gpumgr.node.vdevices import start_server
from gpumgr.requests import podspec
from gpumgr.vdevice.layout import allocation_key

log = logging.getLogger("gpumgr.agent")

OWNER_WAIT_S = 3.0  # how long PreStart waits for the kubelet checkpoint to name the owner
PRESTART_LIST_S = 10.0  # how long PreStart waits for a live pod list (its whole work stays well under 30 s)


class PreStarting(Settling):
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
