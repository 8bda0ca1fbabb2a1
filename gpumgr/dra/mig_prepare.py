"""NodePrepareResources / NodeUnprepareResources of MIG devices (dra/mig_slices.py): the instance is created at
the placement the scheduler allocated and destroyed when its last holder is gone. A MIG device is multi-allocatable:
a claim asking no capacity holds the instance whole; a claim asking cores and memory holds a share of it
(dra/mig_shares.py), and the shares of one placement live in one instance. Crash-safe in the manager's order:

  prepare:    first holder:  1. slot in flight (checkpoint)  2. NVML create  3. slot made + the claim's holding
                             (one checkpoint)
              later shares:  1. the claim's holding in the slot (one checkpoint; the ledger refuses what does not fit)
              then the CDI spec (parent node, GI/CI capability nodes, NVIDIA_VISIBLE_DEVICES=<MIG UUID>); a share also
              gets the fractional claims' vDevice directory, limits and server (the shim through CDI)
  unprepare:  not the last:  1. holding released (checkpoint)
              the last:      1. NVML destroy (claim-made instances)  2. holding released + slot forgotten (one
                             checkpoint)
              then the vDevice server and the CDI spec
  restart:    mig/node.start reconciles (adopt / forget / destroy) and destroys claim slots nobody holds;
              the kubelet's repeated prepare then makes the instance again, so nothing leaks and nothing is lost.
A repeated prepare of a held claim is idempotent (the same instance, the spec and server written again from the
ledger). Prepares and unprepares touching one placement run one at a time (a lock per slot).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumgr.allocator.ledger import Allocation, ClaimHolder, Ledger, LedgerError
from gpumgr.allocator.mig_slots import MigSlot, slot_name
from gpumgr.dra import cdi, mig_shares
from gpumgr.dra.claims import ClaimError, check_uid
from gpumgr.dra.config import CDI_KIND
from gpumgr.dra.keyed_locks import KeyedLocks
from gpumgr.dra.mig_shares import ShareSupport
from gpumgr.dra.mig_slices import DEFAULT_UNIT_MIB, parse_device_name
from gpumgr.mig.caps import CapsError, instance_nodes, read_minors
from gpumgr.mig.manager import MigManager
from gpumgr.mig.types import MigError, MigProfile
from gpumgr.node.claims import LEDGER_PREFIX, claim_keys, vdevice_key
from gpumgr.node.limits import with_compute
from gpumgr.node.state import NodeState
from gpumgr.node.vdevices import start_server
from gpumgr.requests.claim_results import ResultError, allocated_results, share_id

log = logging.getLogger("gpumgr.dra.mig")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class MigResult:
    """One allocation result of a claim naming a MIG device, and what it consumes (cores 100 and memory None: the
    whole instance, unless the node finds less asked)."""

    request: str
    device: str
    cores: int = 100
    memory_bytes: int | None = None
    share_id: str = ""


class MigClaims:
    def __init__(self, state: NodeState, manager: MigManager, cdi_dir: Path, mig_minors: Path, pool: str,
                 shares: ShareSupport | None = None):
        self.state = state
        self.manager = manager
        self.cdi = cdi.CdiDir(cdi_dir)
        self.mig_minors = mig_minors
        self.pool = pool
        self.shares = shares  # None: shares of an instance are refused (no vDevice support given)
        self._slot_locks = KeyedLocks()  # one prepare / unprepare per slot at a time
        self._profiles: dict[tuple[int, int], MigProfile] | None = None  # (card, profile id) -> profile

    @property
    def unit_mib(self) -> int:
        return self.shares.cfg.memory_unit_mib if self.shares is not None else DEFAULT_UNIT_MIB

    async def prepare(self, namespace: str, name: str, uid: str, pod: str, pod_uid: str,
                      results: list[MigResult], pods: int = 1) -> list[str]:
        """The CDI names of the claim's MIG devices, or ClaimError (with nothing left behind). `pods`: how many pods
        the claim is reserved for (a share serves one)."""
        check_uid(uid)
        label = f"claim {namespace}/{name}"
        made: list[str] = []  # keys this call took: given back if a later step fails (all or nothing)
        try:
            for n, r in enumerate(results):
                if await self._one(namespace, name, uid, pod, pod_uid, n, r):
                    made.append(f"{LEDGER_PREFIX}{uid}/{n}")
            names = await self._materialise(label, uid, fresh=bool(made), pods=pods)
        except ClaimError:
            for key in reversed(made):
                try:
                    await self._leave(key)
                except ClaimError as e:  # left to the start-up pass: a claim slot nobody holds is destroyed there
                    log.error("undoing %s after a failed prepare: %s", key, e)
            raise
        return names

    async def _one(self, namespace: str, name: str, uid: str, pod: str, pod_uid: str, n: int, r: MigResult) -> bool:
        """Hold result `n` in its instance (made if it is the first holder); False when it was held already."""
        where = parse_device_name(r.device)
        if where is None:
            raise ClaimError(f"claim {namespace}/{name}: {r.device!r:.80} is not a MIG device of this driver")
        card, profile_id, start = where
        key = f"{LEDGER_PREFIX}{uid}/{n}"
        held = self.state.ledger.allocations.get(key)
        if held is not None and held.mig == slot_name(card, start):
            return False  # a repeat: already made and held
        holder = ClaimHolder(uid=uid, namespace=namespace, name=name, pod=pod, pod_uid=pod_uid,
                             request=r.request, device=r.device, share_id=r.share_id)
        async with self._slot_locks.hold(slot_name(card, start)):
            slot = self.state.ledger.slots.get(slot_name(card, start))
            if slot is None:
                await self._make(key, holder, card, profile_id, start, r)
            else:
                await self._join(key, holder, slot, profile_id, r)
        return True

    async def _join(self, key: str, holder: ClaimHolder, slot: MigSlot, profile_id: int, r: MigResult) -> None:
        """Another share of an instance that exists: one checkpoint, or ClaimError (the ledger says what)."""
        label = f"claim {holder.namespace}/{holder.name}"
        if slot.profile_id != profile_id or not slot.ready or slot.origin != "claim":
            what = "is being made" if not slot.ready else f"holds {slot.profile} ({slot.origin})"
            raise ClaimError(f"{label}: MIG instance {slot.name} on card {slot.card} {what}; it cannot take "
                             f"{r.device} (the scheduler over-committed card {slot.card}; nothing was prepared)")
        alloc = mig_shares.allocation(Allocation(key=key, cards=(slot.card,), cores=100, holder=holder),
                                      slot, r.cores, r.memory_bytes, self.unit_mib)
        try:
            await self.state.commit(lambda led: led.assign(alloc))
        except LedgerError as e:
            raise ClaimError(f"{label} does not fit in MIG instance {slot.name} ({slot.profile}, {slot.memory_mib} "
                             f"MiB): {e} (the scheduler over-committed it; nothing was prepared)") from None
        log.info("%s: joined %s at memory slice %d on card %d (%d cores, %s)", label, slot.profile, slot.start,
                 slot.card, alloc.cores, f"{alloc.memory_mib} MiB" if alloc.cores < 100 else "whole")

    async def _leave(self, key: str) -> None:
        """Release one holding; destroy its instance when it was the last holder of a claim-made one (destroy,
        then forget). A failure is logged and left to the start-up pass (a claim slot nobody holds is destroyed)."""
        alloc = self.state.ledger.allocations.get(key)
        if alloc is None or alloc.mig is None:
            return
        async with self._slot_locks.hold(alloc.mig):
            slot = self.state.ledger.slots.get(alloc.mig)
            others = [k for k in self.state.ledger.slot_holders.get(alloc.mig, {}) if k != key]
            try:
                if slot is None or others or slot.origin != "claim":
                    await self.state.commit(lambda led: led.release(key))
                    return
                if slot.gi is not None:
                    await asyncio.to_thread(self.manager.backend_destroy, slot.card, slot.gi)  # 1

                def forget(led: Ledger) -> None:  # 2
                    led.release(key)
                    led.remove_slot(slot.name)

                await self.state.commit(forget)
                log.info("MIG card %d: destroyed %s at memory slice %d: its last claim left", slot.card,
                         slot.profile, slot.start)
            except (MigError, LedgerError, OSError) as e:
                raise ClaimError(f"{key}: {e}") from None

    async def _make(self, key: str, holder: ClaimHolder, card: int, profile_id: int, start: int,
                    r: MigResult) -> MigSlot:
        label = f"claim {holder.namespace}/{holder.name}"
        prof = await self._profile(label, card, profile_id)
        if prof is None:
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
        alloc = mig_shares.allocation(Allocation(key=key, cards=(card,), cores=100, holder=holder), made, r.cores,
                                      r.memory_bytes, self.unit_mib)

        def record(led: Ledger) -> None:  # 3
            led.update_slot(made)
            led.assign(alloc)

        try:
            await self.state.commit(record)
        except LedgerError as e:  # a share larger than the instance NVML made: nothing kept
            try:
                await asyncio.to_thread(self.manager.backend_destroy, card, inst.gi)
                await self.state.commit(lambda led: led.remove_slot(pending.name))
            except (MigError, LedgerError, OSError) as again:
                log.error("undoing MIG instance %s: %s (the start-up pass destroys it)", pending.name, again)
            raise ClaimError(f"{label} does not fit in MIG instance {made.name} ({made.profile}, {made.memory_mib} "
                             f"MiB): {e}") from None
        log.info("%s: created %s at memory slice %d on card %d (%s)", label, prof.name, start, card, inst.uuid)
        return made

    async def _profile(self, label: str, card: int, profile_id: int) -> MigProfile | None:
        """Card `card`'s MIG profile `profile_id`. A card's profiles are fixed by its model: NVML is read for them
        at the first instance a claim makes and again only for a profile not seen yet (a card whose MIG mode was
        turned on since), not for every claim."""
        if self._profiles is None or (card, profile_id) not in self._profiles:
            try:
                cards = await asyncio.to_thread(self.manager.cards)
            except MigError as e:
                raise ClaimError(f"{label}: {e}") from None
            self._profiles = {(c.index, p.id): p for c in cards for p in c.profiles}
        return self._profiles.get((card, profile_id))

    def _held(self, uid: str) -> list[tuple[Allocation, MigSlot]]:
        led = self.state.ledger
        allocs = [led.allocations[k] for k in claim_keys(led, uid) if led.allocations[k].mig]
        return [(a, led.slots[a.mig or ""]) for a in allocs]

    async def _materialise(self, label: str, uid: str, fresh: bool, pods: int = 1) -> list[str]:
        """The claim's CDI spec (and for shares its vDevice server), from what the ledger holds for it. On failure,
        `fresh` (this call took something): the server and spec it made are taken back."""
        held = self._held(uid)
        unit = self.unit_mib
        minors = await self._read_minors(uid) if held else {}
        if not any(mig_shares.is_limited(a, s, unit) for a, s in held):
            spec = self._spec(uid, minors, [s for _, s in held])
            try:
                await self.state.run_io(self.cdi.write, uid, spec)
            except OSError as e:
                raise ClaimError(f"{label}: writing its CDI spec failed: {e}") from None
            return [f"{CDI_KIND}={d['name']}" for d in spec["devices"]]
        if self.shares is None:
            raise ClaimError(f"{label} asks a share of a MIG instance, but this node has no vDevice support for "
                             "MIG shares (run the DRA front end)")
        if pods > 1:
            raise ClaimError(f"{label} is a share of a MIG instance reserved for {pods} pods; a limited claim may be "
                             "used by one pod only (give each pod its own claim, e.g. a ResourceClaimTemplate)")
        first = held[0][0].holder
        pod_uid = first.pod_uid if isinstance(first, ClaimHolder) else ""
        container = first.name if isinstance(first, ClaimHolder) and _LABEL.match(first.name) else "claim"
        limits = with_compute(self.state.inventory, mig_shares.limits(label, held, pod_uid, container, unit),
                              mig=True)
        sup = self.shares
        key = vdevice_key(uid)
        slots = [(s, self.state.inventory.gpus[s.card].minor, self._caps(uid, minors, s)) for _, s in held]
        ctl = await self.state.run_io(cdi.ctl_devices, sup.cfg.dev_root)
        spec = mig_shares.share_spec(uid, sup, slots, sup.layout.dir_for(key), ctl)
        started, written = await asyncio.gather(
            start_server(sup.vdevices, self.state.inventory, key, limits, {s.card for _, s in held}),
            self.state.run_io(self.cdi.write, uid, spec), return_exceptions=True)
        for outcome in (started, written):
            if isinstance(outcome, BaseException):
                if fresh:
                    await sup.vdevices.stop(key)
                    await self.state.run_io(self.cdi.remove, uid)
                if not isinstance(outcome, Exception):
                    raise outcome
                raise ClaimError(f"{label}: preparing the container edits failed: {str(outcome)[:300]}") from None
        return [f"{CDI_KIND}={d['name']}" for d in spec["devices"]]

    async def restart_servers(self, uid: str) -> None:
        """Without the API (recovery): the claim's vDevice server and spec again, from the ledger alone."""
        held = self._held(uid)
        if held and any(mig_shares.is_limited(a, s, self.unit_mib) for a, s in held):
            await self._materialise(f"claim UID {uid}", uid, fresh=False)

    async def _read_minors(self, uid: str) -> dict[str, int]:
        """The driver's mig-minors file, read off the event loop (once per prepare)."""
        try:
            return await self.state.run_io(read_minors, self.mig_minors)
        except CapsError as e:
            raise ClaimError(f"claim UID {uid}: {e}") from None

    def _caps(self, uid: str, minors: dict[str, int], s: MigSlot) -> list[str]:
        try:
            return list(instance_nodes(minors, self.state.inventory.gpus[s.card].minor, s.gi or 0, s.ci or 0,
                                       self.mig_minors))
        except CapsError as e:
            raise ClaimError(f"claim UID {uid}: {e}") from None

    def _spec(self, uid: str, minors: dict[str, int], slots: list[MigSlot]) -> dict[str, Any]:
        devices = []
        for s in slots:
            nodes = [f"/dev/nvidia{self.state.inventory.gpus[s.card].minor}", *self._caps(uid, minors, s)]
            devices.append({"name": f"claim-{uid}-{s.name}", "containerEdits": {
                "env": [f"NVIDIA_VISIBLE_DEVICES={s.uuid}"],
                "deviceNodes": [{"path": p, "hostPath": p, "permissions": "rw"} for p in nodes]}})
        spec: dict[str, Any] = {"kind": CDI_KIND, "devices": devices, "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl", "permissions": "rw"}]}}
        spec["cdiVersion"] = cdi.minimum_version(spec)
        return spec

    async def unprepare(self, uid: str) -> int:
        """Release the claim's holdings (an instance is destroyed with its last holder); the number released."""
        check_uid(uid)
        keys = [k for k in claim_keys(self.state.ledger, uid) if self.state.ledger.allocations[k].mig]
        for k in keys:
            await self._leave(k)
        if self.shares is not None:
            await self.shares.vdevices.stop(vdevice_key(uid))
        await self.state.run_io(self.cdi.remove, uid)
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
    out = []
    for r in mig:
        cores, memory = mig_shares.amounts(label, r)
        out.append(MigResult(request=str(r.get("request", "")), device=str(r["device"]), cores=cores,
                             memory_bytes=memory, share_id=_share_id(label, r)))
    return out


def _share_id(label: str, r: Mapping[str, Any]) -> str:
    try:
        return share_id(r)
    except ResultError as e:
        raise ClaimError(f"{label}: {e}") from None
