"""What a ResourceClaim's allocation gives one DRA driver, read from API JSON: pure, no I/O, light imports.

This module owns the rule for what a claim consumes, for both readers of it: the node (gpumgr.dra.claims), which
turns each result of its driver into a ledger entry `dra/<claim uid>/<n>` (n: the result's position among the
driver's results) on card `gpu-<index>` of pool = node name, and the scheduler extender, which counts allocated
claims without an inventory at hand. `allocated_results` walks a claim's allocation and `device_amount` reads one
device result: its pool, its card, and the `consumedCapacity` it takes (memory in bytes, cores; each absent =
the whole card). The node adds only what needs its own inventory: the pool is its own, the card exists, the
memory fits on the card (the extender checks the last two against the node's published shape).

A result may name a MIG device of the partitionable pool (`gpu-<card>-mig-<profile>-<profile id>-<start>`,
gpumgr/dra/mig_slices.py): `mig_device` reads its card, profile id and placement. The node prepares such claims on
their own path (gpumgr/dra/mig_prepare.py); the extender counts them against their card (`DriverResult.mig`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.requests.quantity import QuantityError, parse_int

MAX_RESULTS = 32  # resource.k8s.io/v1 AllocationResultsMaxSize
MIB = 2**20
CORES = 100
MAX_UID = 63
MAX_POOL = 253
PUBLISHED_CAPACITY = ("memory", "cores")  # the capacities of every device of the slice (gpumgr.dra.slices)
MAX_MEMORY = 1 << 60  # bytes, exclusive: no card has an exabyte
_GPU = re.compile(r"gpu-[0-9]{1,6}")  # ASCII digits only (str.isdigit() takes "²" and "٣")
_MIG = re.compile(r"gpu-([0-9]{1,4})-mig-[a-z0-9-]{1,40}-([0-9]{1,2})-([0-9]{1,2})\Z")
_SHOWN = 80  # characters of a bad value quoted in an error
MAX_SHARE_ID = 63  # a DNS label; kube-scheduler writes a UUID (36)
_SHARE_ID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?")


class ResultError(ValueError):
    """An allocation, or one device result of it, that no node would grant; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class DeviceAmount:
    """What one device result consumes."""

    pool: str  # the node's name
    device: str  # gpu-<index>
    index: int
    cores: int  # 1..100
    memory_bytes: int | None  # None: the whole card

    @property
    def memory_mib(self) -> int | None:
        return None if self.memory_bytes is None else -(-self.memory_bytes // MIB)


@dataclass(frozen=True, slots=True)
class DriverResult:
    n: int  # position among the driver's results: the ledger key's last part
    pool: str  # the node's name
    index: int  # gpu-<index>
    cores: int  # 1..100
    memory_mib: int | None  # None: the whole card
    mig: tuple[int, int] | None = None  # a MIG device: (profile id, placement start); cores/memory: the card's


def mig_device(device: object) -> tuple[int, int, int] | None:
    """(card, profile id, start) of a MIG device name (`gpu-0-mig-3g-40gb-9-4`); None for any other name."""
    m = _MIG.match(device) if isinstance(device, str) else None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def claim_uid(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and 0 < len(uid) <= MAX_UID and "/" not in uid else ""


def gpu_index(device: object) -> int | None:
    """`gpu-3` -> 3; anything else (another name, not a string) None."""
    if not isinstance(device, str) or not _GPU.fullmatch(device):
        return None
    return int(device[4:])


def allocated_results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """Every device result of the claim's allocation, of any driver (None: not allocated; [] when it has none).
    ResultError when the allocation is malformed: the claim is then refused whole."""
    status = claim.get("status")
    if status is None:
        return None
    if not isinstance(status, Mapping):
        raise ResultError("status must be an object")
    allocation = status.get("allocation")
    if allocation is None:
        return None
    if not isinstance(allocation, Mapping):
        raise ResultError("status.allocation must be an object")
    devices = allocation.get("devices")
    if devices is None:
        return []
    if not isinstance(devices, Mapping):
        raise ResultError("status.allocation.devices must be an object")
    results = devices.get("results")
    if results is None:
        return []
    if not isinstance(results, list) or len(results) > MAX_RESULTS:
        raise ResultError(f"status.allocation.devices.results must be a list of at most {MAX_RESULTS}")
    if not all(isinstance(r, Mapping) for r in results):
        raise ResultError("a result in status.allocation.devices.results is not an object")
    return results


def device_amount(r: Mapping[str, Any]) -> DeviceAmount:
    """One device result of this driver: where it is and what it consumes, or ResultError."""
    pool, device = r.get("pool"), r.get("device")
    if not isinstance(pool, str) or not 0 < len(pool) <= MAX_POOL:
        raise ResultError(f"pool {_show(pool)} is not a node name")
    index = gpu_index(device)
    if index is None or not isinstance(device, str):
        raise ResultError(f"device {_show(device)} in pool {pool} is not a GPU of this driver (gpu-<index>)")
    cores, memory = consumed_amounts(r.get("consumedCapacity"), f"device {pool}/{device}")
    return DeviceAmount(pool=pool, device=device, index=index, cores=cores, memory_bytes=memory)


def share_id(r: Mapping[str, Any]) -> str:
    """A result's shareID ("" when it has none): a DNS label or a UUID, as the API makes it; anything else is a
    ResultError, never cut (two shares cut to the same text would be one share)."""
    share = r.get("shareID")
    if share is None or share == "":
        return ""
    if not isinstance(share, str) or len(share) > MAX_SHARE_ID or not _SHARE_ID.fullmatch(share):
        raise ResultError(f"device {_show(r.get('device'))}: shareID {_show(share)} is not a DNS label (letters, "
                          f"digits and '-', at most {MAX_SHARE_ID} characters)")
    return share


def consumed_amounts(consumed: Any, where: str) -> tuple[int, int | None]:
    """(cores, memory bytes or None: all of it) of a result's `consumedCapacity` (absent: the whole device), or
    ResultError naming `where`. Whole cards and MIG devices publish the same two capacities."""
    if consumed is None:
        consumed = {}
    if not isinstance(consumed, Mapping):
        raise ResultError(f"{where}: consumedCapacity must be an object, not {_show(consumed)}")
    unknown = sorted(str(k) for k in consumed if k not in PUBLISHED_CAPACITY)
    if unknown:  # a capacity the devices never offered: not this driver's allocation, never silently dropped
        raise ResultError(f"{where}: consumedCapacity names {_show(', '.join(unknown[:4]))}, which this driver does "
                          f"not publish (its devices have {' and '.join(PUBLISHED_CAPACITY)})")
    try:
        memory = parse_int(consumed["memory"]) if "memory" in consumed else None
        cores = parse_int(consumed["cores"]) if "cores" in consumed else CORES
    except QuantityError as e:
        raise ResultError(f"{where}: consumedCapacity: {e}") from None
    if memory is not None and not 0 < memory < MAX_MEMORY:
        raise ResultError(f"{where}: consumedCapacity memory {memory} bytes is not a positive amount of memory")
    if not 0 < cores <= CORES:
        raise ResultError(f"{where}: consumedCapacity cores {cores} is outside 1..{CORES}")
    return cores, memory


def driver_results(claim: Mapping[str, Any], driver: str) -> tuple[DriverResult, ...] | None:
    """The claim's results of `driver` (empty: not allocated, or no device of the driver), or None when the
    allocation is malformed (the node refuses such a claim whole)."""
    try:
        results = allocated_results(claim)
        if results is None:
            return ()
        out = []
        for n, r in enumerate(r for r in results if r.get("driver") == driver):
            mig = mig_device(r.get("device"))
            if mig is None:
                a = device_amount(r)
                out.append(DriverResult(n=n, pool=a.pool, index=a.index, cores=a.cores, memory_mib=a.memory_mib))
                continue
            pool = r.get("pool")
            if not isinstance(pool, str) or not 0 < len(pool) <= MAX_POOL:
                raise ResultError(f"pool {_show(pool)} is not a node name")
            out.append(DriverResult(n=n, pool=pool, index=mig[0], cores=CORES, memory_mib=None, mig=mig[1:]))
    except ResultError:
        return None
    return tuple(out)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
