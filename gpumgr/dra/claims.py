"""What a ResourceClaim gives this driver on this node: its results, read from the claim's status.

Pure: a claim (API JSON) in, a `ClaimGrant` out, or a `ClaimError` whose message says what is wrong with that
one claim. Nothing here touches the ledger. What a device result consumes is read by gpumgr.requests.claim_results, the
rule the scheduler extender counts claims by too; this module adds what only the node knows (its pool, its cards).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.devices.types import Inventory
from gpumgr.dra.slices import CORES, MIB, memory_ceiling
from gpumgr.requests.claim_results import ResultError, allocated_results, device_amount, share_id

MAX_RESERVED = 256  # a claim may be reserved for at most 256 consumers (ResourceClaimReservedForMaxSize)
MAX_NAMED = 5  # pods named in an error (the rest counted): 256 names made a 1,670-character message
MAX_NAME_SHOWN = 253  # characters of one pod name in an error
MAX_DRIVER = 63  # characters of another driver's name quoted in an error (a driver name is a DNS subdomain)
_UID = re.compile(r"^[0-9a-zA-Z][0-9a-zA-Z-]{0,62}$")


class ClaimError(ValueError):
    """This claim cannot be prepared here; the message names the claim and what is wrong."""


def check_uid(uid: str) -> str:
    if not _UID.match(uid or ""):
        raise ClaimError(f"claim UID {uid!r} is not a Kubernetes UID")
    return uid


def grant_from_claim(claim: Mapping[str, Any], *, namespace: str, name: str, uid: str, driver: str,
                     pool: str, inventory: Inventory) -> ClaimGrant:
    label = f"claim {namespace}/{name}"
    meta = claim.get("metadata")
    api_uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if api_uid != uid:
        raise ClaimError(f"{label}: UID mismatch: the kubelet asked for {uid}, the API has {api_uid} "
                         "(the claim was deleted and recreated; the kubelet will retry with the new one)")
    try:
        results = allocated_results(claim)
    except ResultError as e:
        raise ClaimError(f"{label}: {e}") from None
    if results is None:
        raise ClaimError(f"{label} is not allocated (no status.allocation): the scheduler has not placed it yet")
    pods = reserved_pods(label, claim)
    if not pods:
        raise ClaimError(f"{label} is not reserved for any pod (status.reservedFor is empty)")
    mine: list[DeviceGrant] = []
    others = set()
    for r in results:
        if r.get("driver") != driver:
            others.add(str(r.get("driver"))[:MAX_DRIVER])
            continue
        mine.append(_device_grant(label, r, pool, inventory))
    if not mine:
        raise ClaimError(f"{label} has no device of driver {driver}" +
                         (f" (its devices belong to {', '.join(sorted(others))})" if others else ""))
    return ClaimGrant(namespace=namespace, name=name, uid=uid, pods=tuple(pods), devices=tuple(mine))


def reserved_pods(label: str, claim: Mapping[str, Any]) -> list[PodRef]:
    """The pods in the claim's status.reservedFor (other kinds of consumer skipped)."""
    status = claim.get("status")
    reserved = (status.get("reservedFor") if isinstance(status, Mapping) else None) or []
    if not isinstance(reserved, list) or len(reserved) > MAX_RESERVED:
        raise ClaimError(f"{label}: status.reservedFor must be a list of at most {MAX_RESERVED}")
    return [PodRef(name=str(ref.get("name", "")), uid=ref["uid"]) for ref in reserved
            if isinstance(ref, dict) and ref.get("resource") == "pods" and isinstance(ref.get("uid"), str)]


def _device_grant(label: str, r: Mapping[str, Any], pool: str, inv: Inventory) -> DeviceGrant:
    """What one result of this driver consumes (the rule in gpumgr.requests.claim_results, shared with the
    extender), checked against what only the node knows: its pool and its cards."""
    try:
        got, share = device_amount(r), share_id(r)
    except ResultError as e:
        raise ClaimError(f"{label}: {e}") from None
    where = f"{label}: device {got.pool}/{got.device}"
    if got.pool != pool:
        raise ClaimError(f"{where} is in pool {got.pool!r}, not this node's pool {pool!r}")
    if got.index >= inv.count:
        raise ClaimError(f"{where}: no such device on node {pool} (devices gpu-0..gpu-{inv.count - 1})")
    card_bytes = inv.gpus[got.index].memory_mib * MIB
    memory = card_bytes if got.memory_bytes is None else got.memory_bytes
    if memory > card_bytes:
        raise ClaimError(f"{where}: consumedCapacity memory {memory} bytes is outside 1..{card_bytes}")
    return DeviceGrant(request=str(r.get("request", "")), device=got.device, index=got.index,
                       share_id=share, memory_bytes=memory, cores=got.cores)


def per_card(grant: ClaimGrant) -> list[CardGrant]:
    """One entry per card, in the order the cards first appear: a card granted to several requests of the claim
    (a device that allows multiple allocations) gets their amounts summed, cores capped at 100."""
    cards: dict[int, CardGrant] = {}
    for d in grant.devices:
        got = cards.get(d.index)
        if got is None:
            cards[d.index] = CardGrant(index=d.index, device=d.device, memory_bytes=d.memory_bytes, cores=d.cores)
        else:
            cards[d.index] = CardGrant(index=d.index, device=d.device, memory_bytes=got.memory_bytes + d.memory_bytes,
                                       cores=min(CORES, got.cores + d.cores))
    return list(cards.values())


def check_enforceable(grant: ClaimGrant, inventory: Inventory, memory_unit_mib: int) -> list[CardGrant]:
    """The claim's cards, or a ClaimError when the shim could not enforce what was granted:
    - different core shares on its cards (the limits file has one core limit per container);
    - a limited (fractional) claim reserved for more than one pod (each pod has its own shared-memory
      accounting, so N pods could use N times the claim's memory)."""
    label = f"claim {grant.namespace}/{grant.name}"
    cards = per_card(grant)
    shares = sorted({c.cores for c in cards})
    if len(shares) > 1:
        listed = ", ".join(f"{c.device} {c.cores}" for c in cards)
        raise ClaimError(f"{label}: its devices have different core shares ({listed}); the shim enforces one core "
                         "limit per container: ask the same cores on every device, or use one claim per share")
    limited = any(c.cores < CORES or c.memory_bytes < memory_ceiling(inventory.gpus[c.index].memory_mib,
                                                                     memory_unit_mib) for c in cards)
    if limited and len(grant.pods) > 1:
        shown = [p.name or p.uid for p in grant.pods[:MAX_NAMED]]
        more = len(grant.pods) - len(shown)
        names = ", ".join(n[:MAX_NAME_SHOWN] for n in shown) + (f" and {more} more" if more else "")
        raise ClaimError(f"{label} is a fractional (limited) claim shared by {len(grant.pods)} pods ({names}); "
                         "each pod would get the whole limit: a limited claim may be used by one pod only "
                         "(give each pod its own claim, e.g. a ResourceClaimTemplate; whole-card claims may be "
                         "shared)")
    return cards


@dataclass(frozen=True)
class CardGrant:
    index: int
    device: str
    memory_bytes: int
    cores: int


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str


@dataclass(frozen=True)
class DeviceGrant:
    request: str
    device: str
    index: int
    share_id: str
    memory_bytes: int
    cores: int

    @property
    def memory_mib(self) -> int:
        return -(-self.memory_bytes // MIB)


@dataclass(frozen=True)
class ClaimGrant:
    namespace: str
    name: str
    uid: str
    pods: tuple[PodRef, ...]
    devices: tuple[DeviceGrant, ...]
