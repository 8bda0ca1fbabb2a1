"""Bring the DRA claims back after a restart (agent, kubelet, node, or kill -9 mid-prepare).

Three witnesses: the ledger (from the checkpoint), the claims in the API, and the CDI specs on disk.
- a claim the API still allocates to this node for a pod, that the ledger holds or that has a spec: held again
  exactly (ledger, vDevice server, CDI spec);
- ledger entries and specs of claims the API no longer allocates here (deleted, deallocated, another UID):
  freed, spec and vDevice directory removed;
- a claim allocated here but neither held nor specced was never prepared: the kubelet will ask.
If the API cannot be listed, nothing is freed: what the ledger holds is brought back, and the rest waits.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gpumgr.allocator import ClaimHolder
from gpumgr.dra.claims import ClaimError, ClaimGrant, DeviceGrant, PodRef, grant_from_claim
from gpumgr.dra.mig_prepare import MigResult, mig_results_of
from gpumgr.dra.preparer import ClaimPreparer
from gpumgr.dra.slices import MIB
from gpumgr.node.claims import claim_keys, claim_uids

log = logging.getLogger("gpumgr.dra.recovery")
ListClaims = Callable[[], Awaitable[list[dict[str, Any]]]]


async def recover(preparer: ClaimPreparer, list_claims: ListClaims) -> RecoveryReport:
    cfg = preparer.cfg
    report = RecoveryReport()
    held = claim_uids(preparer.state.ledger)
    specced = set(await preparer.state.run_io(preparer.cdi.claim_uids))
    try:
        claims = await list_claims()
    except Exception as e:  # noqa: BLE001 - keep everything until the API answers
        log.error("DRA recovery: listing ResourceClaims failed (%s); keeping all %d prepared claims", e, len(held))
        claims = None
    live: dict[str, ClaimGrant] = {}
    mig_live: dict[str, tuple[dict[str, Any], list[MigResult]]] = {}
    for c in claims or []:
        meta = c.get("metadata") or {}
        try:
            mig = mig_results_of(c, cfg.driver_name, cfg.node_name)
        except ClaimError:
            continue
        if mig:  # a claim of MIG devices: its instance is restored by MigClaims (an idempotent prepare)
            mig_live[str(meta.get("uid", ""))] = (c, mig)
            continue
        try:
            grant = grant_from_claim(c, namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                                     uid=str(meta.get("uid", "")), driver=cfg.driver_name, pool=cfg.node_name,
                                     inventory=preparer.state.inventory)
        except ClaimError:
            continue  # not ours, not here, not reserved, or not allocated
        live[grant.uid] = grant
    for uid in sorted(held | specced):
        found = live.get(uid)
        if uid in mig_live:
            c, results = mig_live[uid]
            meta = c.get("metadata") or {}
            try:
                await preparer.prepare_mig(c, str(meta.get("namespace", "")), str(meta.get("name", "")), uid, results)
                report.restored.append(uid)
            except ClaimError as e:
                log.error("DRA recovery: %s", e)
                report.failed.append(uid)
        elif found is not None:
            try:
                await preparer.restore(found)
                report.restored.append(uid)
            except ClaimError as e:
                log.error("DRA recovery: %s", e)
                report.failed.append(uid)
        elif claims is None:
            if uid in held:
                report.kept.append(uid)
        else:
            await preparer.unprepare(uid)
            report.freed.append(uid)
            log.info("DRA recovery: claim UID %s is no longer allocated here: freed, spec removed", uid)
    if claims is None:  # MIG claims: their instances and CDI specs stay as they are; shares get their servers back
        mig_uids = {u for u in held if any(preparer.state.ledger.allocations[k].mig
                                           for k in claim_keys(preparer.state.ledger, u))}
        await _restart_servers(preparer, held - mig_uids)
        for uid in sorted(mig_uids):
            if preparer.mig is not None:
                try:
                    await preparer.mig.restart_servers(uid)
                except ClaimError as e:
                    log.error("DRA recovery: %s", e)
    return report


async def _restart_servers(preparer: ClaimPreparer, uids: set[str]) -> None:
    """Without the API: bring back the vDevice servers of what the ledger holds, from the ledger itself."""
    ledger = preparer.state.ledger
    for uid in sorted(uids):
        allocs = [ledger.allocations[k] for k in claim_keys(ledger, uid)]
        if not allocs:
            continue
        claims = [a.claim or ClaimHolder(uid=uid, namespace="", name="") for a in allocs]
        first = claims[0]
        grant = ClaimGrant(namespace=first.namespace, name=first.name, uid=uid,
                           pods=(PodRef(first.pod, first.pod_uid),),
                           devices=tuple(DeviceGrant(request=c.request, device=c.device, index=a.cards[0],
                                                     share_id=c.share_id, memory_bytes=a.memory_mib * MIB,
                                                     cores=a.cores)
                                         for a, c in zip(allocs, claims, strict=True)))
        try:
            await preparer.restore(grant)
        except ClaimError as e:
            log.error("DRA recovery: %s", e)


@dataclass
class RecoveryReport:
    restored: list[str] = field(default_factory=list)
    freed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
