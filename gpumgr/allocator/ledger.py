"""The ledger: per card free cores, free memory, who holds what, and health.

The single source of truth for allocation state on a node. Every change goes through `assign` or `release`;
both are all-or-nothing. Card state (free, shared, exclusive) is derived from the allocations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpumgr.allocator.request import HUNDRED


class LedgerError(ValueError):
    """An assignment that would over-commit a card, or a malformed ledger document."""


class Ledger:
    def __init__(self, card_memory_mib: Iterable[int]):
        self.cards: list[CardState] = [CardState(index=i, memory_mib=m) for i, m in enumerate(card_memory_mib)]
        self.allocations: dict[str, Allocation] = {}

    # -- queries --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.cards)

    def card(self, index: int) -> CardState:
        if not 0 <= index < len(self.cards):
            raise LedgerError(f"no card {index} (node has {len(self.cards)})")
        return self.cards[index]

    def held_by(self, key: str) -> Allocation | None:
        return self.allocations.get(key)

    def largest_card_mib(self) -> int:
        return max((c.memory_mib for c in self.cards), default=0)

    def problem(self, alloc: Allocation, check_health: bool = True) -> str | None:
        """Why `alloc` cannot be assigned now, or None if it can."""
        if alloc.key in self.allocations:
            return f"{alloc.key} already holds cards {list(self.allocations[alloc.key].cards)}"
        if not alloc.cards:
            return "no cards"
        if len(set(alloc.cards)) != len(alloc.cards):
            return f"card listed twice in {list(alloc.cards)}"
        if not alloc.reserve:  # rides on another allocation's reservation: takes nothing itself
            bad = [i for i in alloc.cards if not 0 <= i < len(self.cards)]
            return f"no card {bad[0]} (node has {len(self.cards)})" if bad else None
        whole = alloc.cores >= HUNDRED
        if whole and len(alloc.cards) != alloc.cores // HUNDRED:
            return f"{alloc.cores} cores need {alloc.cores // HUNDRED} cards, got {len(alloc.cards)}"
        if not whole and len(alloc.cards) != 1:
            return "a share of a card must be on exactly one card"
        for i in alloc.cards:
            if not 0 <= i < len(self.cards):
                return f"no card {i} (node has {len(self.cards)})"
            c = self.cards[i]
            if check_health and not c.healthy:
                return f"card {i} is unhealthy"
            if whole and c.mode != "free":
                return f"card {i} is {c.mode}, a whole-card request needs a free card"
            if not whole:
                if c.mode == "exclusive":
                    return f"card {i} is held whole"
                if c.free_cores < alloc.cores:
                    return f"card {i} has {c.free_cores} free cores, {alloc.cores} asked"
                if c.free_memory_mib < alloc.memory_mib:
                    return f"card {i} has {c.free_memory_mib} MiB free, {alloc.memory_mib} MiB asked"
        return None

    # -- changes --------------------------------------------------------------------------------------------
    def assign(self, alloc: Allocation, check_health: bool = True) -> None:
        """Take the cards for `alloc`, or raise LedgerError and change nothing.

        `check_health=False` is for restoring what a running pod already holds on a card that has since
        turned unhealthy: running pods keep their cards; only new allocations avoid sick ones.
        """
        reason = self.problem(alloc, check_health)
        if reason:
            raise LedgerError(f"cannot assign {alloc.key}: {reason}")
        for i in alloc.cards:
            self.cards[i].holders[alloc.key] = alloc.holding_on(self.cards[i])
        self.allocations[alloc.key] = alloc

    def release(self, key: str) -> Allocation | None:
        """Give back exactly what `key` took. Releasing what is not held changes nothing and returns None."""
        alloc = self.allocations.pop(key, None)
        if alloc is None:
            return None
        for i in alloc.cards:
            self.cards[i].holders.pop(key, None)
        return alloc

    def set_healthy(self, index: int, healthy: bool) -> bool:
        """Mark a card; returns True when that changed anything."""
        c = self.card(index)
        changed = c.healthy != healthy
        c.healthy = healthy
        return changed

    def copy(self) -> Ledger:
        other = Ledger(c.memory_mib for c in self.cards)
        for c, o in zip(self.cards, other.cards, strict=True):
            o.healthy = c.healthy
            o.holders = dict(c.holders)
        other.allocations = dict(self.allocations)
        return other

    # -- persistence ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "cards": [{"index": c.index, "memory_mib": c.memory_mib} for c in self.cards],
            "allocations": [a.to_json() for a in sorted(self.allocations.values(), key=lambda a: a.key)],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], legacy: bool | None = None) -> Ledger:
        """`legacy`: allocations in format version 1 (see `Allocation.from_json`)."""
        try:
            cards = sorted(doc["cards"], key=lambda c: int(c["index"]))
            if [int(c["index"]) for c in cards] != list(range(len(cards))):
                raise LedgerError("card indices are not 0..N-1")
            ledger = cls(int(c["memory_mib"]) for c in cards)
            for a in doc["allocations"]:
                ledger.assign(Allocation.from_json(a, legacy), check_health=False)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, LedgerError):
                raise
            raise LedgerError(f"malformed ledger: {e!r}") from None
        return ledger


@dataclass(frozen=True)
class Holding:
    cores: int
    memory_mib: int


@dataclass
class CardState:
    index: int
    memory_mib: int
    healthy: bool = True
    holders: dict[str, Holding] = field(default_factory=dict)

    @property
    def used_cores(self) -> int:
        return sum(h.cores for h in self.holders.values())

    @property
    def free_cores(self) -> int:
        return max(0, HUNDRED - self.used_cores)

    @property
    def free_memory_mib(self) -> int:
        return max(0, self.memory_mib - sum(h.memory_mib for h in self.holders.values()))

    @property
    def mode(self) -> str:
        reserving = [h for h in self.holders.values() if h.cores or h.memory_mib]
        if not reserving:  # nobody, or only containers riding on a reservation elsewhere
            return "free"
        if any(h.cores >= HUNDRED for h in reserving):
            return "exclusive"
        return "shared"



@dataclass(frozen=True)
class ContainerHolder:
    """A container of a pod (the device-plugin front end): guessed at Allocate, verified at PreStartContainer."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    container_index: int = 0
    init: bool = False  # an init container: the kubelet may hand its devices on to the pod's app containers
    memory_units: int | None = None  # vcuda-memory units the container asks (None: not known)


@dataclass(frozen=True)
class ClaimHolder:
    """A DRA ResourceClaim (the DRA front end): the claim holds the device; its pod is the one it was prepared for."""

    uid: str
    namespace: str
    name: str
    pod: str = ""
    pod_uid: str = ""
    request: str = ""
    device: str = ""
    share_id: str = ""


Holder = ContainerHolder | ClaimHolder


@dataclass(frozen=True)
class Allocation:
    """What one holder took: cards, cores asked, memory reserved, and what is known of the holder."""

    key: str
    cards: tuple[int, ...]
    cores: int
    memory_mib: int = 0
    holder: Holder | None = None  # None: a container nobody could be named for yet (whole cards, no pending pod)
    verified: bool = False  # the kubelet named the holder (PreStartContainer), or a claim the API allocated
    # False: a container reusing devices its pod already reserved (an app container on an init container's
    # devices, or the other way round); it is recorded, but takes nothing from the cards itself
    reserve: bool = True
    rides_on: str | None = None  # the key of the allocation whose reservation this one uses (reserve False)
    ids: tuple[str, ...] = ()  # an init container's device IDs, which the kubelet may hand on to an app container
    created: int | None = None  # Unix seconds: the grace of an allocation the kubelet has not recorded yet
    answered_memory_mib: int | None = None  # the memory Allocate's answer named (only when certain)
    guess_of: int | None = None  # unverified, guessed among this many pending pods (None: one, or verified)

    def holding_on(self, card: CardState) -> Holding:
        if not self.reserve:
            return Holding(cores=0, memory_mib=0)
        if self.cores >= HUNDRED:
            return Holding(cores=HUNDRED, memory_mib=card.memory_mib)
        return Holding(cores=self.cores, memory_mib=self.memory_mib)

    # -- who holds it (empty text when not known) -----------------------------------------------------------
    @property
    def pod_uid(self) -> str:
        return self.holder.pod_uid if self.holder is not None else ""

    @property
    def namespace(self) -> str:
        return self.holder.namespace if self.holder is not None else ""

    @property
    def pod(self) -> str:
        return self.holder.pod if self.holder is not None else ""

    @property
    def container(self) -> str:
        return self.holder.container if isinstance(self.holder, ContainerHolder) else ""

    @property
    def container_holder(self) -> ContainerHolder | None:
        return self.holder if isinstance(self.holder, ContainerHolder) else None

    @property
    def claim(self) -> ClaimHolder | None:
        return self.holder if isinstance(self.holder, ClaimHolder) else None

    @property
    def is_init(self) -> bool:
        return isinstance(self.holder, ContainerHolder) and self.holder.init

    # -- persistence ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"key": self.key, "cards": list(self.cards), "cores": self.cores,
                               "memory_mib": self.memory_mib, "verified": self.verified}
        if self.holder is not None:
            doc["holder"] = _holder_json(self.holder)
        if not self.reserve:
            doc["reserve"] = False
        for name in ("rides_on", "created", "answered_memory_mib", "guess_of"):
            value = getattr(self, name)
            if value is not None:
                doc[name] = value
        if self.ids:
            doc["ids"] = list(self.ids)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], legacy: bool | None = None) -> Allocation:
        """An allocation from its JSON, every field type-checked (LedgerError naming the field otherwise).
        `legacy`: the document is of checkpoint format version 1, whose labels were a map of strings (`meta`);
        None: decided by the document (a `meta` field)."""
        if legacy is None:
            legacy = "meta" in doc
        key = doc.get("key")
        if not isinstance(key, str):
            raise LedgerError("an allocation's key must be text")
        where = f"allocation {_clip(key)}"
        allowed = _V1_FIELDS if legacy else _FIELDS
        unknown = sorted(str(k) for k in doc if k not in allowed)
        if unknown:
            raise LedgerError(f"{where}: unknown field {_clip(unknown[0])!r}"
                              + (" (format version 1 has no typed fields)" if legacy else ""))
        cards = doc.get("cards")
        if not isinstance(cards, list) or not all(_is_int(c) for c in cards):
            raise LedgerError(f"{where}: cards must be a list of card indices")
        base = cls(key=key, cards=tuple(cards), cores=_whole(doc, "cores", where, 0, _BIG),
                   memory_mib=_whole(doc, "memory_mib", where, 0, _BIG, 0), reserve=_flag(doc, "reserve", where, True))
        if legacy:
            return _from_meta(base, doc.get("meta", {}), where)
        holder = doc.get("holder")
        return replace(
            base, holder=None if holder is None else _holder_from(holder, where),
            verified=_flag(doc, "verified", where, False),
            rides_on=_text(doc, "rides_on", where) if doc.get("rides_on") is not None else None,
            ids=_ids(doc.get("ids", []), where), created=_maybe_whole(doc, "created", where, 0, _SECONDS),
            answered_memory_mib=_maybe_whole(doc, "answered_memory_mib", where, 0, _BIG),
            guess_of=_maybe_whole(doc, "guess_of", where, 2, _MAX_GUESS))


# -- the allocation's JSON ----------------------------------------------------------------------------------------
_FIELDS = frozenset({"key", "cards", "cores", "memory_mib", "verified", "holder", "reserve", "rides_on", "ids",
                     "created", "answered_memory_mib", "guess_of"})
_V1_FIELDS = frozenset({"key", "cards", "cores", "memory_mib", "meta", "reserve"})
_CONTAINER_FIELDS = ("pod_uid", "namespace", "pod", "container", "container_index", "init", "memory_units")
_CLAIM_FIELDS = ("uid", "namespace", "name", "pod", "pod_uid", "request", "device", "share_id")
_BIG = 1 << 40
_SECONDS = 10**12
_MAX_GUESS = 1 << 20
_MAX_TEXT = 4096
_MAX_IDS = 1 << 17  # an init container's IDs: at most 100 per card
_MAX_META = 64


def _clip(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[:width] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _whole(doc: Mapping[str, Any], name: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    v = doc.get(name, default)
    if not _is_int(v) or not lo <= v < hi:
        raise LedgerError(f"{where}: {name} must be a whole number {lo}..{hi - 1}, got {_clip(repr(v), 40)}")
    return int(v)


def _maybe_whole(doc: Mapping[str, Any], name: str, where: str, lo: int, hi: int) -> int | None:
    return None if doc.get(name) is None else _whole(doc, name, where, lo, hi)


def _flag(doc: Mapping[str, Any], name: str, where: str, default: bool) -> bool:
    v = doc.get(name, default)
    if not isinstance(v, bool):
        raise LedgerError(f"{where}: {name} must be true or false, got {_clip(repr(v), 40)}")
    return v


def _text(doc: Mapping[str, Any], name: str, where: str, default: str | None = None) -> str:
    v = doc.get(name, default)
    if not isinstance(v, str) or len(v) > _MAX_TEXT:
        raise LedgerError(f"{where}: {name} must be text of at most {_MAX_TEXT} characters, got {_clip(repr(v), 40)}")
    return v


def _ids(v: object, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or len(v) > _MAX_IDS or not all(isinstance(d, str) and 0 < len(d) <= 256 for d in v):
        raise LedgerError(f"{where}: ids must be a list of device IDs")
    return tuple(v)


def _holder_json(h: Holder) -> dict[str, Any]:
    if isinstance(h, ContainerHolder):
        doc: dict[str, Any] = {"kind": "container", **{f: getattr(h, f) for f in _CONTAINER_FIELDS}}
        if h.memory_units is None:
            del doc["memory_units"]
        return doc
    return {"kind": "claim", **{f: getattr(h, f) for f in _CLAIM_FIELDS}}


def _holder_from(doc: object, where: str) -> Holder:
    if not isinstance(doc, dict):
        raise LedgerError(f"{where}: holder must be an object")
    kind = doc.get("kind")
    fields = _CONTAINER_FIELDS if kind == "container" else _CLAIM_FIELDS if kind == "claim" else None
    if fields is None:
        raise LedgerError(f"{where}: holder.kind must be container or claim, got {_clip(repr(kind), 40)}")
    unknown = sorted(str(k) for k in doc if k != "kind" and k not in fields)
    if unknown:
        raise LedgerError(f"{where}: unknown field holder.{_clip(unknown[0])}")
    at = f"{where}: holder"
    if kind == "claim":
        return ClaimHolder(**{f: _text(doc, f, at, "" if f not in ("uid", "namespace", "name") else None)
                              for f in _CLAIM_FIELDS})
    return ContainerHolder(
        pod_uid=_text(doc, "pod_uid", at), namespace=_text(doc, "namespace", at), pod=_text(doc, "pod", at),
        container=_text(doc, "container", at), container_index=_whole(doc, "container_index", at, 0, 10**6, 0),
        init=_flag(doc, "init", at, False), memory_units=_maybe_whole(doc, "memory_units", at, 0, 1 << 31))


# format version 1: the same facts as a map of strings; numbers the agent read must be ASCII numbers
_META_NUMBERS = {"created": (r"[0-9]{1,12}(\.[0-9]{0,9})?", _SECONDS), "memory_units": (r"-?[0-9]{1,9}", 1 << 31),
                 "container_index": (r"[0-9]{1,6}", 10**6), "answered_memory_mib": (r"[0-9]{1,12}", _BIG)}


def _from_meta(base: Allocation, meta: object, where: str) -> Allocation:
    """A format version 1 allocation (its labels a map of strings) as the typed record."""
    if not isinstance(meta, dict) or len(meta) > _MAX_META or not all(isinstance(v, str) for v in meta.values()):
        raise LedgerError(f"{where}: meta must be an object of at most {_MAX_META} text values")
    numbers: dict[str, int | None] = {}
    for name, (pattern, _hi) in _META_NUMBERS.items():
        text = meta.get(name)
        if text is not None and not re.fullmatch(pattern, text, flags=re.ASCII):
            raise LedgerError(f"{where}: meta.{name} must be an ASCII number, got {_clip(repr(text), 40)}")
        numbers[name] = int(float(text)) if text else None
    units = numbers["memory_units"]
    guess = meta.get("guess_of")
    holder: Holder | None = None
    if meta.get("claim") or meta.get("front_end") == "dra":
        ns, _, name = meta.get("claim", "").partition("/")
        holder = ClaimHolder(uid=meta.get("claim_uid", ""), namespace=ns or meta.get("namespace", ""), name=name,
                             pod=meta.get("pod", ""), pod_uid=meta.get("pod_uid", ""), request=meta.get("request", ""),
                             device=meta.get("device", ""), share_id=meta.get("share_id", ""))
    elif meta.get("pod_uid") or meta.get("pod"):
        holder = ContainerHolder(pod_uid=meta.get("pod_uid", ""), namespace=meta.get("namespace", ""),
                                 pod=meta.get("pod", ""), container=meta.get("container", ""),
                                 container_index=numbers["container_index"] or 0, init=meta.get("init") == "true",
                                 memory_units=units if units is not None and units >= 0 else None)
    return replace(base, holder=holder, verified=meta.get("verified") == "true", rides_on=meta.get("rides_on") or None,
                   ids=tuple(d for d in meta.get("ids", "").split(",") if d), created=numbers["created"],
                   answered_memory_mib=numbers["answered_memory_mib"],
                   guess_of=(int(guess) if guess.isascii() and guess.isdigit() and int(guess) > 1 else 2)
                   if guess is not None else None)
