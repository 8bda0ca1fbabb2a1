"""Shares of a MIG instance through DRA: what one result of a MIG device takes, and what a share gets.

Pure (no I/O). A MIG device is multi-allocatable (dra/mig_slices.py): a claim asking no capacity gets the
requestPolicy defaults (100 cores, the instance's memory rounded down to a step): the whole instance, prepared as
before (no shim, no limits). A claim asking less gets a share: a ledger allocation inside the instance's slot
(`Allocation.mig`) with its cores and memory, and the limits fractional claims get (the limits file and vCUDA
socket of a vDevice directory, the shim through CDI), whose device is the MIG instance: its MIG UUID and its
parent card's index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumgr.allocator.ledger import HUNDRED, Allocation
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.dra import cdi
from gpumgr.dra.claims import ClaimError
from gpumgr.dra.config import DraConfig
from gpumgr.dra.slices import memory_ceiling
from gpumgr.requests.claim_results import ResultError, consumed_amounts
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.limits import DeviceLimit, Limits
from gpumgr.vdevice.server import VDeviceManager

MIB = 2**20


def amounts(label: str, result: Mapping[str, Any]) -> tuple[int, int | None]:
    """(cores, memory bytes or None: all of it) a MIG device result consumes, or ClaimError."""
    try:
        return consumed_amounts(result.get("consumedCapacity"), f"{label}: device {str(result.get('device'))[:80]}")
    except ResultError as e:
        raise ClaimError(str(e)) from None


def allocation(base: Allocation, slot: MigSlot, cores: int, memory_bytes: int | None, unit_mib: int) -> Allocation:
    """`base` (key, holder) placed in `slot`: the whole instance when it asks all cores and (up to the request
    step) all memory; else a share of `cores` and the memory in MiB (rounded up)."""
    whole = cores >= HUNDRED and (memory_bytes is None or memory_bytes >= memory_ceiling(slot.memory_mib, unit_mib))
    if whole:
        return Allocation(key=base.key, cards=(slot.card,), cores=HUNDRED, holder=base.holder, verified=True,
                          mig=slot.name)
    memory_mib = slot.memory_mib if memory_bytes is None else -(-memory_bytes // MIB)
    return Allocation(key=base.key, cards=(slot.card,), cores=cores, memory_mib=memory_mib, holder=base.holder,
                      verified=True, mig=slot.name)


def memory_limit(alloc: Allocation, slot: MigSlot, unit_mib: int) -> int:
    """Bytes the shim caps the share at; 0: no cap (the instance whole, or all its memory up to the step)."""
    if not alloc.memory_mib or alloc.memory_mib * MIB >= memory_ceiling(slot.memory_mib, unit_mib):
        return 0
    return alloc.memory_mib * MIB


def is_limited(alloc: Allocation, slot: MigSlot, unit_mib: int) -> bool:
    return alloc.cores < HUNDRED or memory_limit(alloc, slot, unit_mib) > 0


def limits(label: str, held: Sequence[tuple[Allocation, MigSlot]], pod_uid: str, container: str,
           unit_mib: int) -> Limits:
    """The claim's limits: one core limit (all its shares ask the same cores, else ClaimError) and per instance
    its MIG UUID, its parent card's index and the share's memory."""
    cores = sorted({a.cores for a, _ in held})
    if len(cores) > 1:
        raise ClaimError(f"{label}: its MIG shares ask different cores ({', '.join(map(str, cores))}); the shim "
                         "enforces one core limit per container: ask the same cores on every device")
    core = cores[0] if cores and cores[0] < HUNDRED else 0
    return Limits(pod_uid=pod_uid, container_name=container, core_limit=core, hard_limit=True, core_ceiling=0,
                  devices=tuple(DeviceLimit(uuid=s.uuid, index=s.card, memory_limit_bytes=memory_limit(a, s, unit_mib))
                                for a, s in held))


def share_spec(uid: str, support: ShareSupport, slots: Sequence[tuple[MigSlot, int, list[str]]],
               vdevice_dir: Path, ctl_devices: list[str]) -> dict[str, Any]:
    """The CDI spec of a claim holding shares: the fractional claims' edits (shim, vDevice directory, limits,
    `NVIDIA_VISIBLE_DEVICES` = the MIG UUIDs), one device per instance with the parent node and the instance's
    GPU- and compute-instance capability nodes. `slots`: (slot, parent minor, capability nodes)."""
    cfg = support.cfg
    spec = cdi.build_spec(claim_uid=uid, gpus=[(s.card, minor, s.uuid) for s, minor, _ in slots],
                          ctl_devices=ctl_devices, driver_dir=cfg.driver_dir, shim_dir=cfg.shim_dir,
                          vdevice_dir=vdevice_dir, limited=True, shim_log_level=cfg.shim_log_level, annotations={})
    spec["devices"] = [{"name": f"claim-{uid}-{s.name}", "containerEdits": {"deviceNodes": [
        {"path": p, "hostPath": p, "permissions": "rw"} for p in [f"/dev/nvidia{minor}", *caps]]}}
        for s, minor, caps in slots]
    spec["cdiVersion"] = cdi.minimum_version(spec)
    return spec


@dataclass(frozen=True)
class ShareSupport:
    """What a share needs beyond the instance: the DRA settings (shim, driver, request step) and the node's
    vDevice directories and servers (the fractional claims')."""

    cfg: DraConfig
    layout: VDeviceLayout
    vdevices: VDeviceManager
