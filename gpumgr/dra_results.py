"""What a ResourceClaim's allocation gives one DRA driver, read from API JSON: pure, no I/O, light imports.

The node (gpumgr.dra.claims) turns each result of its driver into a ledger entry `dra/<claim uid>/<n>` (n: the
result's position among the driver's results) on card `gpu-<index>` of pool = node name, taking
`consumedCapacity` memory (bytes, rounded up to MiB) and cores, each absent = the whole card. The scheduler
extender counts allocated claims the same way; this is that rule for a reader that has no inventory at hand
(an absent memory is None: the whole card, whatever its size).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.dra.quantity import QuantityError, parse_int

MAX_RESULTS = 32  # resource.k8s.io/v1 AllocationResultsMaxSize
MIB = 2**20
CORES = 100
MAX_UID = 63
MAX_POOL = 253


@dataclass(frozen=True, slots=True)
class DriverResult:
    n: int  # position among the driver's results: the ledger key's last part
    pool: str  # the node's name
    index: int  # gpu-<index>
    cores: int  # 1..100
    memory_mib: int | None  # None: the whole card


def claim_uid(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and 0 < len(uid) <= MAX_UID and "/" not in uid else ""


def driver_results(claim: Mapping[str, Any], driver: str) -> tuple[DriverResult, ...] | None:
    """The claim's results of `driver` (empty: not allocated, or no device of the driver), or None when the
    allocation is malformed (the node refuses such a claim whole)."""
    status = claim.get("status")
    if not isinstance(status, Mapping):
        return () if status is None else None
    allocation = status.get("allocation")
    if allocation is None:
        return ()
    if not isinstance(allocation, Mapping):
        return None
    devices = allocation.get("devices") or {}
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if results is None:
        return ()
    if not isinstance(results, list) or len(results) > MAX_RESULTS:
        return None
    out: list[DriverResult] = []
    for r in results:
        if not isinstance(r, Mapping):
            return None
        if r.get("driver") != driver:
            continue
        got = _result(len(out), r)
        if got is None:
            return None
        out.append(got)
    return tuple(out)


def _result(n: int, r: Mapping[str, Any]) -> DriverResult | None:
    pool, device = r.get("pool"), r.get("device")
    if not isinstance(pool, str) or not 0 < len(pool) <= MAX_POOL or not isinstance(device, str):
        return None
    if not device.startswith("gpu-") or not device[4:].isdigit() or len(device) > 10:
        return None
    consumed = r.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping):
        return None
    try:
        memory = parse_int(consumed["memory"]) if "memory" in consumed else None
        cores = parse_int(consumed["cores"]) if "cores" in consumed else CORES
    except QuantityError:
        return None
    if not 0 < cores <= CORES or (memory is not None and not 0 < memory < 1 << 60):
        return None
    return DriverResult(n=n, pool=pool, index=int(device[4:]), cores=cores,
                        memory_mib=None if memory is None else -(-memory // MIB))
