"""NodePrepareResources / NodeUnprepareResources of MIG devices (dra/mig_slices.py): the instance is created at
the placement the scheduler allocated and destroyed at unprepare. Crash-safe in the manager's order:

  prepare:    1. slot in flight (checkpoint)  2. NVML create  3. slot made + the claim's holding (one checkpoint)
              4. CDI spec (parent node, GI/CI capability nodes, NVIDIA_VISIBLE_DEVICES=<MIG UUID>)
  unprepare:  1. NVML destroy                 2. holding released + slot forgotten (one checkpoint)  3. CDI spec
  restart:    mig/node.start reconciles (adopt / forget / destroy) and destroys claim slots nobody holds;
              the kubelet's repeated prepare then makes the instance again, so nothing leaks and nothing is lost.
A repeated prepare of a held claim is idempotent (the same instance, the CDI spec written again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumgr.allocator.ledger import Allocation, ClaimHolder, Ledger, LedgerError
from gpumgr.allocator.mig_slots import MigSlot, slot_name
from gpumgr.dra import cdi
from gpumgr.dra.claims import ClaimError, check_uid
from gpumgr.dra.config import CDI_KIND
from gpumgr.dra.mig_slices import parse_device_name
from gpumgr.mig.caps import CapsError, instance_nodes, read_minors
from gpumgr.mig.manager import MigManager
from gpumgr.mig.types import MigError
from gpumgr.node.claims import LEDGER_PREFIX, claim_keys
from gpumgr.node.state import NodeState
from gpumgr.requests.claim_results import ResultError, allocated_results

log = logging.getLogger("gpumgr.dra.mig")


@dataclass(frozen=True)
class MigResult:
    """One allocation result of a claim naming a MIG device."""

    request: str
    device: str


class MigClaims:
    def __init__(self, state: NodeState, manager: MigManager, cdi_dir: Path, mig_minors: Path, pool: str):
        self.state = state
        self.manager = manager
        self.cdi = cdi.CdiDir(cdi_dir)
        self.mig_minors = mig_minors
        self.pool = pool

    async def prepare(self, namespace: str, name: str, uid: str, pod: str, pod_uid: str,
                      results: list[MigResult]) -> list[str]:
        """The CDI names of the claim's MIG devices, or ClaimError (with nothing left behind)."""
        check_uid(uid)
        slots: list[MigSlot] = []
        made: list[tuple[str, MigSlot]] = []  # by this call: undone if a later device fails (all or nothing)
        try:
            for n, r in enumerate(results):
                slot, fresh = await self._one(namespace, name, uid, pod, pod_uid, n, r)
                slots.append(slot)
                if fresh:
                    made.append((f"{LEDGER_PREFIX}{uid}/{n}", slot))
            spec = self._spec(uid, slots)
        except ClaimError:
            for key, slot in reversed(made):
                await self._undo(key, slot)
            raise
        await self.state.run_io(self.cdi.write, uid, spec)
        return [f"{CDI_KIND}={d['name']}" for d in spec["devices"]]

    async def _one(self, namespace: str, name: str, uid: str, pod: str, pod_uid: str, n: int,
                   r: MigResult) -> tuple[MigSlot, bool]:
        """The slot of result `n`, and whether this call made it."""
        where = parse_device_name(r.device)
        if where is None:
            raise ClaimError(f"claim {namespace}/{name}: {r.device!r:.80} is not a MIG device of this driver")
        card, profile_id, start = where
        key = f"{LEDGER_PREFIX}{uid}/{n}"
        held = self.state.ledger.allocations.get(key)
        if held is not None and held.mig == slot_name(card, start):
            return self.state.ledger.slots[held.mig], False  # a repeat: already made and held
        holder = ClaimHolder(uid=uid, namespace=namespace, name=name, pod=pod, pod_uid=pod_uid,
                             request=r.request, device=r.device)
        return await self._make(key, holder, card, profile_id, start), True

    async def _undo(self, key: str, slot: MigSlot) -> None:
        """Take back one instance this prepare made (destroy, then forget); a failure is logged and left to the
        start-up pass (a claim slot nobody holds is destroyed there)."""
        try:
            if slot.gi is not None:
                await asyncio.to_thread(self.manager.backend_destroy, slot.card, slot.gi)

            def forget(led: Ledger) -> None:
                led.release(key)
                led.remove_slot(slot.name)

            await self.state.commit(forget)
        except (MigError, LedgerError, OSError) as e:
            log.error("undoing MIG instance %s after a failed prepare: %s", slot.name, e)

    async def _make(self, key: str, holder: ClaimHolder, card: int, profile_id: int, start: int) -> MigSlot:
        label = f"claim {holder.namespace}/{holder.name}"
        info = next((c for c in await asyncio.to_thread(self.manager.cards) if c.index == card), None)
        prof = info.profile(profile_id) if info else None
        if info is None or prof is None:
            raise ClaimError(f"{label}: card {card} has no MIG profile {profile_id}")
        pending = MigSlot(card=card, start=start, size=prof.memory_slices, profile_id=prof.id, profile=prof.name,
                          memory_mib=prof.memory_mib, origin="claim")
        try:
            await self.state.commit(lambda led: led.add_slot(pending))  # 1
        except LedgerError as e:
            raise ClaimError(f"{label}: {e} (the scheduler over-committed card {card}; nothing was made)") from None
        try:
            inst = await asyncio.to_thread(self.manager.backend_create, card, prof.id, start)  # 2
        except MigError as e:
            await self.state.commit(lambda led: led.remove_slot(pending.name))
            raise ClaimError(f"{label}: {e}") from None
        made = MigSlot(card=card, start=start, size=prof.memory_slices, profile_id=prof.id, profile=prof.name,
                       memory_mib=inst.memory_mib, origin="claim", gi=inst.gi, ci=inst.ci, uuid=inst.uuid)

        def record(led: Ledger) -> None:  # 3
            led.update_slot(made)
            led.assign(Allocation(key=key, cards=(card,), cores=100, holder=holder, verified=True, mig=made.name))

        await self.state.commit(record)
        log.info("%s: created %s at memory slice %d on card %d (%s)", label, prof.name, start, card, inst.uuid)
        return made

    def _spec(self, uid: str, slots: list[MigSlot]) -> dict[str, Any]:
        try:
            minors = read_minors(self.mig_minors)
        except CapsError as e:
            raise ClaimError(f"claim UID {uid}: {e}") from None
        devices = []
        for s in slots:
            parent = self.state.inventory.gpus[s.card].minor
            try:
                gi_node, ci_node = instance_nodes(minors, parent, s.gi or 0, s.ci or 0, self.mig_minors)
            except CapsError as e:
                raise ClaimError(f"claim UID {uid}: {e}") from None
            nodes = [f"/dev/nvidia{parent}", gi_node, ci_node]
            devices.append({"name": f"claim-{uid}-{s.name}", "containerEdits": {
                "env": [f"NVIDIA_VISIBLE_DEVICES={s.uuid}"],
                "deviceNodes": [{"path": p, "hostPath": p, "permissions": "rw"} for p in nodes]}})
        spec: dict[str, Any] = {"kind": CDI_KIND, "devices": devices, "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl", "permissions": "rw"}]}}
        spec["cdiVersion"] = cdi.minimum_version(spec)
        return spec

    async def unprepare(self, uid: str) -> int:
        """Destroy the claim's instances and free them; the number freed (0: nothing was held)."""
        check_uid(uid)
        keys = [k for k in claim_keys(self.state.ledger, uid) if self.state.ledger.allocations[k].mig]
        for k in keys:
            slot = self.state.ledger.slots[self.state.ledger.allocations[k].mig or ""]
            if slot.gi is not None:
                try:
                    await asyncio.to_thread(self.manager.backend_destroy, slot.card, slot.gi)  # 1
                except MigError as e:
                    raise ClaimError(f"claim UID {uid}: {e}") from None

            def forget(led: Ledger, key: str = k, name: str = slot.name) -> None:  # 2
                led.release(key)
                led.remove_slot(name)

            await self.state.commit(forget)
        await self.state.run_io(self.cdi.remove, uid)  # 3
        return len(keys)


def mig_results_of(claim: Mapping[str, Any], driver: str, pool: str) -> list[MigResult]:
    """This driver's results of `claim` when they name MIG devices ([] when none does); ClaimError when the claim
    mixes MIG devices with whole/fractional ones (one claim is prepared by one path) or names another pool."""
    try:
        results = allocated_results(claim) or []
    except ResultError:
        return []  # malformed: the whole-card path reports it
    mine = [r for r in results if r.get("driver") == driver]
    mig = [r for r in mine if parse_device_name(str(r.get("device", ""))) is not None]
    if not mig:
        return []
    meta = claim.get("metadata") or {}
    label = f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    if len(mig) != len(mine):
        raise ClaimError(f"{label} mixes MIG devices with whole or fractional ones: use one claim for each")
    if any(r.get("pool") != pool for r in mig):
        raise ClaimError(f"{label}: a MIG device of another pool than this node's ({pool})")
    return [MigResult(request=str(r.get("request", "")), device=str(r["device"])) for r in mig]


def first_pod(claim: Mapping[str, Any]) -> tuple[str, str]:
    """(name, uid) of the first pod the claim is reserved for; ("", "") when none."""
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if isinstance(ref, dict) and ref.get("resource") == "pods" and isinstance(ref.get("uid"), str):
            return str(ref.get("name", "")), ref["uid"]
    return "", ""
