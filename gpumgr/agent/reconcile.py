"""Bringing the ledger back to what the running pods really hold: at start, periodically, and when pods go.

Sources: our checkpoint (already loaded into the ledger), the kubelet's checkpoint (read-only: who holds which
device IDs) and the live pods on this node. Free what no live pod holds; restore what a live pod holds but the
ledger lost; correct a guessed owner the kubelet contradicts; make sure every verified container's vDevice
server runs and no stale one does. An allocation the kubelet has not recorded yet is kept for a grace period
(its Allocate may have been answered just before a crash, before the kubelet wrote its file).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from gpumgr.agent.gone import gone
from gpumgr.agent.round_pods import RoundPods
from gpumgr.agent.service import AllocationService
from gpumgr.agent.truth import apply_truths
from gpumgr.allocator import Allocation, Ledger
from gpumgr.deviceplugin import ids as devids
from gpumgr.node import binding
from gpumgr.node.claims import is_claim
from gpumgr.node.kubelet_checkpoint import KubeletCheckpointError
from gpumgr.node.owner import allocation_for
from gpumgr.node.vdevices import start_server, sweep_orphans
from gpumgr.requests import podspec
from gpumgr.vdevice.layout import allocation_key

log = logging.getLogger("gpumgr.reconcile")

async def reconcile(service: AllocationService, pods_synced: bool, grace_s: float, why: str,
                    full: bool = True, round_pods: RoundPods | None = None) -> Report:
    """`full=False` (on pod changes) only frees what pods that are gone or finished held; the full pass does
    everything. Both name owners from the kubelet checkpoint (one stat when it is unchanged): a static pod's
    mirror pod recreated under a new UID is still the pod the kubelet records, and keeps its cards. `round_pods`:
    the round's pods, shared with the MIG holdings' pass (listed here when not given)."""
    state = service.state
    report = Report(why=why)
    kubelet_ok, entries = False, []
    seen = dict(state.ledger.allocations)  # before the kubelet's record is read: decisions are made on these
    try:
        ckpt = await service.kubelet_checkpoint()
        kubelet_ok = True
        entries = [e for e in ckpt.entries if e.resource_name == podspec.RESOURCE_CORE]
    except KubeletCheckpointError as err:
        log.error("reconcile (%s): kubelet checkpoint unreadable, freeing nothing on its account: %s", why, err)
    view = round_pods if round_pods is not None else RoundPods(service.pods)
    pods = view.by_uid  # static pods also by their mirror pod's config.mirror UID, as the kubelet knows them
    live = {uid for uid, p in pods.items() if binding.is_live(p)}
    holders: dict[str, list[tuple[str, str]]] = {}
    ids_of: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        key = allocation_key(entry.device_ids)
        holders.setdefault(key, []).append((entry.pod_uid, entry.container_name))
        ids_of[key] = entry.device_ids
    owners: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for key, listed in holders.items():
        holder, cname = binding.app_owner(listed, pods.get(listed[0][0]))
        api_uid = str(pods[holder]["metadata"]["uid"]) if holder in pods else holder  # a static pod's mirror UID
        owners[key] = (api_uid, cname, ids_of[key])

    now = time.time()
    release: list[str] = []
    missing: list[tuple[str, str]] = []  # (key, owner uid) of allocations whose pod the cache no longer has
    for a in seen.values():
        if is_claim(a) or a.mig is not None:  # a DRA claim's, or a MIG instance's: their front ends answer
            continue
        if any(h in live for h, _ in holders.get(a.key, ())):
            continue  # the kubelet records it for a live pod (a static pod by its config.mirror UID): never freed
        owner = owners.get(a.key)
        uid = owner[0] if owner else (a.pod_uid if a.verified else None)
        if uid:
            if pods_synced and uid not in pods:
                missing.append((a.key, uid))
            elif uid in pods and uid not in live:
                release.append(a.key)
                report.freed_finished += 1
        elif full and kubelet_ok and now - (a.created or 0) > grace_s:
            release.append(a.key)  # never recorded by the kubelet: the admission failed or was never completed
            report.freed_unrecorded += 1
    freed = await gone(view, [(k, uid) for k, uid in missing if view.predates(seen[k])])
    release += freed
    report.freed_gone += len(freed)

    restore: list[Allocation] = []
    for key, (uid, cname, ids) in owners.items():
        if not full or uid not in live:
            continue
        have = state.ledger.held_by(key)
        pod = pods[uid]
        if have is not None and is_claim(have):
            continue
        if have is not None and have.pod_uid == uid and have.container == cname:
            if have.verified or (pod.get("status") or {}).get("phase") != "Running":
                continue
            # the kubelet names this owner and the container runs, so its PreStart was passed: a ledger that lost
            # that (an older checkpoint generation after a torn write) verifies it again, and its server restarts
            restore.append(replace(have, guess_of=None, verified=True))
            continue
        ask = binding.find_container(pod, cname)
        if ask is None:
            continue
        try:
            cards = tuple(sorted(devids.cards_of(state.inventory, ids, "c")))
        except devids.BadDeviceID as e:
            log.error("reconcile: kubelet checkpoint entry of pod %s container %s: %s", uid, cname, e)
            continue
        restore.append(allocation_for(binding.Candidate(pod, ask, None, ()), cards, key,
                                      state.memory_unit_mib, verified=True, ids=list(ids)))

    if release:
        # only what still holds what it held when decided on (an Allocate may have replaced it in the meantime)
        removed = await service.release(release, f"reconcile ({why}): no live pod holds it", expect=seen)
        report.vdevices_removed += len(removed)
    restore = _group_reuse(restore, owners)
    # a container riding on a reservation that is gone (its pod's other container was freed) reserves again
    for a in state.ledger.allocations.values():
        if not a.reserve and not is_claim(a) and a.rides_on not in state.ledger.allocations \
                and a.key not in release and all(r.key != a.key for r in restore):
            restore.append(replace(a, reserve=True, rides_on=None))
    if restore:
        def apply(ledger: Ledger) -> None:
            report.conflicts = [why for _, why in apply_truths(ledger, restore, owners, seen)]
            report.restored = len(restore) - len(report.conflicts)

        await state.commit(apply)
    for c in report.conflicts:
        log.error("reconcile (%s): the kubelet says a running pod holds cards the ledger cannot give it: %s", why, c)

    # vDevice servers: every verified allocation of a live pod has one, nothing else does
    running = service.vdevices.running()
    for a in list(state.ledger.allocations.values()):
        uid = a.pod_uid
        if is_claim(a) or not a.verified or uid not in live or a.mig is not None:  # (MIG: gpumgr/mig/holdings.py)
            continue
        limits = service.limits.get(a, pods[uid])
        if running.get(a.key) != limits:
            await start_server(service.vdevices, state.inventory, a.key, limits, a.cards)
            report.vdevices_started += 1
            service.schedule_annotations(uid)
    service.limits.keep_only(state.ledger.allocations)
    report.vdevices_removed += await sweep_orphans(state, service.layout, service.vdevices)
    if report.changed:
        log.info("reconcile (%s): %s", why, report.summary())
    return report


def _group_reuse(restore: list[Allocation], owners: dict[str, tuple[str, str, tuple[str, ...]]]) -> list[Allocation]:
    """Containers of one pod restored from the kubelet's record whose devices overlap (an app container reusing
    its init container's): the one with the most devices reserves, with the largest memory; the others ride."""
    out = list(restore)
    by_pod: dict[str, list[int]] = {}
    for i, a in enumerate(out):
        by_pod.setdefault(a.pod_uid, []).append(i)
    for idxs in by_pod.values():
        if len(idxs) < 2:
            continue
        idxs.sort(key=lambda i: -len(owners[out[i].key][2]))
        top = idxs[0]
        top_ids = set(owners[out[top].key][2])
        for i in idxs[1:]:
            if set(owners[out[i].key][2]) <= top_ids:
                if out[top].cores < 100:
                    out[top] = replace(out[top], memory_mib=max(out[top].memory_mib, out[i].memory_mib))
                out[i] = replace(out[i], reserve=False, rides_on=out[top].key)
    return out


@dataclass
class Report:
    why: str
    freed_gone: int = 0
    freed_finished: int = 0
    freed_unrecorded: int = 0
    restored: int = 0
    vdevices_started: int = 0
    vdevices_removed: int = 0
    conflicts: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.freed_gone or self.freed_finished or self.freed_unrecorded or self.restored
                    or self.vdevices_started or self.vdevices_removed or self.conflicts)

    def summary(self) -> str:
        return (f"freed {self.freed_gone} of deleted pods, {self.freed_finished} of finished pods, "
                f"{self.freed_unrecorded} never recorded by the kubelet; restored {self.restored}; vDevice servers "
                f"started {self.vdevices_started}, removed {self.vdevices_removed}; conflicts {len(self.conflicts)}")
