"""The ledger: per card free cores, free memory, who holds what, and health.

The single source of truth for allocation state on a node. Every change goes through `assign` or `release`;
both are all-or-nothing. Card state (free, shared, exclusive) is derived from the allocations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpumgr.allocator.mig_slots import MigSlot, SlotError, parse_slot_name
from gpumgr.allocator.request import HUNDRED

_T = TypeVar("_T")


class LedgerError(ValueError):
    """An assignment that would over-commit a card, or a malformed ledger document."""


class Ledger:
    def __init__(self, card_memory_mib: Iterable[int]):
        self.cards: list[CardState] = [CardState(index=i, memory_mib=m) for i, m in enumerate(card_memory_mib)]
        self.allocations: dict[str, Allocation] = {}
        self.slots: dict[str, MigSlot] = {}  # MIG instances by slot name (see mig_slots.py)
        self.slot_holders: dict[str, dict[str, Holding]] = {}  # slot name -> allocation key -> what it takes

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
        if alloc.mig is not None:
            return self._slot_problem(alloc, check_health)
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
            if c.mig:
                return f"card {i} is in MIG mode: only its MIG instances can be asked for"
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
        if alloc.mig is not None:
            slot = self.slots[alloc.mig]
            self.slot_holders[slot.name][alloc.key] = alloc.holding_in(slot)
        else:
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
        if alloc.mig is not None:
            self.slot_holders.get(alloc.mig, {}).pop(key, None)
        return alloc

    # -- MIG slots ------------------------------------------------------------------------------------------
    def _slot_problem(self, alloc: Allocation, check_health: bool) -> str | None:
        slot = self.slots.get(alloc.mig or "")
        if slot is None:
            return f"no MIG instance {alloc.mig} on this node"
        if alloc.cards != (slot.card,):
            return f"MIG instance {slot.name} is on card {slot.card}, not {list(alloc.cards)}"
        if not slot.ready:
            return f"MIG instance {slot.name} is not made yet"
        if check_health and not self.cards[slot.card].healthy:
            return f"card {slot.card} is unhealthy"
        held = self.slot_holders[slot.name].values()
        if any(h.cores >= HUNDRED for h in held):
            return f"MIG instance {slot.name} is held whole"
        if alloc.cores >= HUNDRED:
            return f"MIG instance {slot.name} is shared, a whole-instance request needs it free" if held else None
        free_cores = HUNDRED - sum(h.cores for h in held)
        free_mib = slot.memory_mib - sum(h.memory_mib for h in held)
        if free_cores < alloc.cores:
            return f"MIG instance {slot.name} has {free_cores} free cores, {alloc.cores} asked"
        if free_mib < alloc.memory_mib:
            return f"MIG instance {slot.name} has {free_mib} MiB free, {alloc.memory_mib} MiB asked"
        return None

    def add_slot(self, slot: MigSlot) -> None:
        """Record a MIG instance (or one about to be made), or raise LedgerError and change nothing: the card
        must hold nothing outside MIG, and no other slot may overlap its placement."""
        c = self.card(slot.card)
        if slot.name in self.slots:
            raise LedgerError(f"MIG instance {slot.name} is already recorded")
        if c.holders:
            raise LedgerError(f"card {slot.card} is held outside MIG ({len(c.holders)} holders): no MIG instance "
                              "until they are gone")
        other = next((o for o in self.slots.values() if o.overlaps(slot)), None)
        if other is not None:
            raise LedgerError(f"MIG instance {slot.name} would overlap {other.name} on card {slot.card}")
        self.slots[slot.name] = slot
        self.slot_holders[slot.name] = {}
        c.slots.add(slot.name)

    def update_slot(self, slot: MigSlot) -> None:
        """Replace a recorded slot by the same placement with what NVML made (GI, CI, UUID)."""
        old = self.slots.get(slot.name)
        if old is None or (old.card, old.start, old.size, old.profile_id) != \
                (slot.card, slot.start, slot.size, slot.profile_id):
            raise LedgerError(f"MIG instance {slot.name} is not recorded with that profile and placement")
        self.slots[slot.name] = slot

    def remove_slot(self, name: str) -> MigSlot | None:
        """Forget a MIG instance; refused (LedgerError) while an allocation lives in it."""
        slot = self.slots.get(name)
        if slot is None:
            return None
        if self.slot_holders.get(name):
            raise LedgerError(f"MIG instance {name} is held by {sorted(self.slot_holders[name])[0]}")
        del self.slots[name]
        self.slot_holders.pop(name, None)
        self.cards[slot.card].slots.discard(name)
        return slot

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """What NVML says of the card's MIG mode (learnt at every start, not checkpointed)."""
        self.card(index).mig_mode = enabled

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
            o.mig_mode = c.mig_mode
            o.slots = set(c.slots)
        other.allocations = dict(self.allocations)
        other.slots = dict(self.slots)
        other.slot_holders = {k: dict(v) for k, v in self.slot_holders.items()}
        return other

    # -- persistence ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "cards": [{"index": c.index, "memory_mib": c.memory_mib} for c in self.cards],
            "allocations": [a.to_json() for a in sorted(self.allocations.values(), key=lambda a: a.key)],
        }
        if self.slots:  # absent without MIG: such a ledger reads back in a gpumgr that knows no MIG
            doc["mig"] = [s.to_json() for s in sorted(self.slots.values(), key=lambda s: (s.card, s.start))]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], legacy: bool | None = None) -> Ledger:
        """`legacy`: allocations in format version 1 (see `Allocation.from_json`)."""
        unknown = sorted(str(k) for k in doc if k not in _LEDGER_FIELDS)
        if unknown:
            raise LedgerError(f"ledger: unknown field {_clip(unknown[0])!r}")
        for c in doc.get("cards") or []:
            extra = sorted(str(k) for k in c if k not in _CARD_FIELDS) if isinstance(c, dict) else []
            if extra:
                raise LedgerError(f"ledger card: unknown field {_clip(extra[0])!r}")
        try:
            cards = sorted(doc["cards"], key=lambda c: int(c["index"]))
            if [int(c["index"]) for c in cards] != list(range(len(cards))):
                raise LedgerError("card indices are not 0..N-1")
            ledger = cls(int(c["memory_mib"]) for c in cards)
            slots = doc.get("mig", [])
            if not isinstance(slots, list) or len(slots) > _MAX_SLOTS:
                raise LedgerError(f"mig must be a list of at most {_MAX_SLOTS} MIG instances")
            for s in slots:
                ledger.add_slot(MigSlot.from_json(s))
            for a in doc["allocations"]:
                ledger.assign(Allocation.from_json(a, legacy), check_health=False)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, LedgerError):
                raise
            if isinstance(e, SlotError):
                raise LedgerError(str(e)) from None
            raise LedgerError(f"malformed ledger: {e!r}") from None
        for a in ledger.allocations.values():
            base = ledger.allocations.get(a.rides_on) if a.rides_on is not None else None
            if a.rides_on is not None and (base is None or not base.reserve or set(a.cards) - set(base.cards)):
                # riding on nothing would hold cards without counting them against any card
                raise LedgerError(f"allocation {_clip(a.key)}: rides on {_clip(a.rides_on)}, which does not reserve "
                                  "its cards")
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
    mig_mode: bool = False  # NVML says MIG is on (learnt at start)
    slots: set[str] = field(default_factory=set)  # MIG instances the ledger holds on this card

    @property
    def mig(self) -> bool:
        """In MIG mode, or holding MIG instances: nothing but its instances can be asked for."""
        return self.mig_mode or bool(self.slots)

    @property
    def used_cores(self) -> int:
        return sum(h.cores for h in self.holders.values())

    @property
    def free_cores(self) -> int:
        return 0 if self.mig else max(0, HUNDRED - self.used_cores)

    @property
    def free_memory_mib(self) -> int:
        if self.mig:
            return 0
        return max(0, self.memory_mib - sum(h.memory_mib for h in self.holders.values()))

    @property
    def mode(self) -> str:
        if self.mig:
            return "mig"
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

    def __post_init__(self) -> None:
        # the one rule for what a holder may be: the agent's writer and both checkpoint readers build through here
        for name in ("pod_uid", "namespace", "pod", "container"):
            _check_text(name, getattr(self, name))
        _check_whole("container_index", self.container_index)
        if not isinstance(self.init, bool):
            raise LedgerError(f"init must be true or false, got {_clip(repr(self.init), 40)}")
        if self.memory_units is not None:
            _check_whole("memory_units", self.memory_units)


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

    def __post_init__(self) -> None:
        for name in _CLAIM_FIELDS:
            _check_text(name, getattr(self, name))
        if not self.uid:
            raise LedgerError("a claim holder needs the claim's uid")


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
    mig: str | None = None  # the MIG instance (slot name) this lives in: whole (cores 100) or a share of it

    def __post_init__(self) -> None:
        # bounds here, not only in the reader: `commit` then refuses what the next start could not read back
        _check_text("key", self.key)
        if not isinstance(self.cards, tuple) or not all(_is_int(c) and 0 <= c < _MAX_CARD for c in self.cards):
            raise LedgerError(f"{_clip(self.key)}: cards must be card indices 0..{_MAX_CARD - 1}")
        for name in ("cores", "memory_mib"):
            _check_whole(name, getattr(self, name))
        for name in ("created", "answered_memory_mib", "guess_of"):
            if getattr(self, name) is not None:
                _check_whole(name, getattr(self, name))
        for name in ("verified", "reserve"):
            if not isinstance(getattr(self, name), bool):
                raise LedgerError(f"{name} must be true or false, got {_clip(repr(getattr(self, name)), 40)}")
        if not isinstance(self.ids, tuple) or len(self.ids) > _MAX_IDS \
                or not all(isinstance(d, str) and 0 < len(d) <= _MAX_ID for d in self.ids):
            raise LedgerError(f"ids must be at most {_MAX_IDS} device IDs of 1..{_MAX_ID} characters")
        if self.holder is not None and not isinstance(self.holder, ContainerHolder | ClaimHolder):
            raise LedgerError(f"holder must be a container or a claim, got {type(self.holder).__name__}")
        # one definition of a claim: its key is dra/<claim uid>/<n> and its holder that claim
        if self.key.startswith(CLAIM_PREFIX) != isinstance(self.holder, ClaimHolder) or (
                isinstance(self.holder, ClaimHolder) and self.key.split("/")[1:2] != [self.holder.uid]):
            raise LedgerError(f"{_clip(self.key)}: a {CLAIM_PREFIX}<uid>/<n> key is held by claim <uid>, and only "
                              "there")
        if self.rides_on is not None:
            _check_text("rides_on", self.rides_on)
            if self.reserve or self.rides_on == self.key:
                raise LedgerError(f"{_clip(self.key)}: rides_on names another allocation, and only when reserve "
                                  "is false")
        elif not self.reserve:
            raise LedgerError(f"{_clip(self.key)}: reserve false needs rides_on (the reservation it uses)")
        if self.mig is not None and (parse_slot_name(self.mig) is None or len(self.cards) != 1
                                     or self.cores > HUNDRED):
            raise LedgerError(f"{_clip(self.key)}: mig names one MIG instance (mig-<card>-<start>) on its one card, "
                              "with at most 100 cores")

    @property
    def is_claim(self) -> bool:
        return isinstance(self.holder, ClaimHolder)

    def holding_in(self, slot: MigSlot) -> Holding:
        if self.cores >= HUNDRED:
            return Holding(cores=HUNDRED, memory_mib=slot.memory_mib)
        return Holding(cores=self.cores, memory_mib=self.memory_mib)

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
        for name in ("rides_on", "created", "answered_memory_mib", "guess_of", "mig"):
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
        base: dict[str, Any] = dict(key=key, cards=tuple(cards), cores=_whole(doc, "cores", where),
                                    memory_mib=_whole(doc, "memory_mib", where, 0))
        reserve = _flag(doc, "reserve", where, True)
        if legacy:
            return _from_meta(base, doc.get("meta", {}), where, reserve)
        holder = doc.get("holder")
        rides_on = _text(doc, "rides_on", where) if doc.get("rides_on") is not None else None
        fields = dict(holder=None if holder is None else _holder_from(holder, where),
                      verified=_flag(doc, "verified", where, False), reserve=reserve, rides_on=rides_on,
                      ids=_ids(doc.get("ids", []), where), created=_maybe_whole(doc, "created", where),
                      answered_memory_mib=_maybe_whole(doc, "answered_memory_mib", where),
                      guess_of=_maybe_whole(doc, "guess_of", where),
                      mig=_text(doc, "mig", where) if doc.get("mig") is not None else None)
        return _build(where, lambda: cls(**base, **fields))  # type: ignore[arg-type]


# -- the allocation's JSON ----------------------------------------------------------------------------------------
CLAIM_PREFIX = "dra/"  # ledger keys of DRA claims: dra/<claim uid>/<result index>
_FIELDS = frozenset({"key", "cards", "cores", "memory_mib", "verified", "holder", "reserve", "rides_on", "ids",
                     "created", "answered_memory_mib", "guess_of", "mig"})
_V1_FIELDS = frozenset({"key", "cards", "cores", "memory_mib", "meta", "reserve"})
_LEDGER_FIELDS = frozenset({"cards", "allocations", "mig"})
_MAX_SLOTS = 1024 * 8
_CARD_FIELDS = frozenset({"index", "memory_mib"})
_CONTAINER_FIELDS = ("pod_uid", "namespace", "pod", "container", "container_index", "init", "memory_units")
_CLAIM_FIELDS = ("uid", "namespace", "name", "pod", "pod_uid", "request", "device", "share_id")
_BIG = 1 << 40
_SECONDS = 10**12
_MAX_GUESS = 1 << 20
_MAX_TEXT = 4096
_MAX_ID = 256
_MAX_IDS = 1 << 17  # an init container's IDs: at most 100 per card
_MAX_CARD = 1024
_MAX_META = 64
# every whole number of the record: lo <= value < hi (one table for the constructors and both readers)
BOUNDS: dict[str, tuple[int, int]] = {
    "cores": (0, _BIG), "memory_mib": (0, _BIG), "created": (0, _SECONDS), "answered_memory_mib": (0, _BIG),
    "guess_of": (2, _MAX_GUESS), "container_index": (0, 10**6), "memory_units": (0, 1 << 31),
}


def in_bounds(name: str, value: int) -> bool:
    lo, hi = BOUNDS[name]
    return lo <= value < hi


def _clip(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[:width] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_whole(name: str, v: object) -> None:
    lo, hi = BOUNDS[name]
    if not _is_int(v) or not lo <= v < hi:  # type: ignore[operator]
        raise LedgerError(f"{name} must be a whole number {lo}..{hi - 1}, got {_clip(repr(v), 40)}")


def _check_text(name: str, v: object) -> None:
    if not isinstance(v, str) or len(v) > _MAX_TEXT:
        raise LedgerError(f"{name} must be text of at most {_MAX_TEXT} characters, got {_clip(repr(v), 40)}")


def _build(where: str, make: Callable[[], _T]) -> _T:
    """`make()`, its LedgerError told where in the document."""
    try:
        return make()
    except LedgerError as e:
        raise LedgerError(f"{where}: {e}") from None


def _whole(doc: Mapping[str, Any], name: str, where: str, default: int | None = None) -> int:
    v = doc.get(name, default)
    lo, hi = BOUNDS[name]
    if not _is_int(v) or not lo <= v < hi:
        raise LedgerError(f"{where}: {name} must be a whole number {lo}..{hi - 1}, got {_clip(repr(v), 40)}")
    return int(v)


def _maybe_whole(doc: Mapping[str, Any], name: str, where: str) -> int | None:
    return None if doc.get(name) is None else _whole(doc, name, where)


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
    if not isinstance(v, list) or len(v) > _MAX_IDS \
            or not all(isinstance(d, str) and 0 < len(d) <= _MAX_ID for d in v):
        raise LedgerError(f"{where}: ids must be a list of at most {_MAX_IDS} device IDs of 1..{_MAX_ID} characters")
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
        texts = {f: _text(doc, f, at, "" if f not in ("uid", "namespace", "name") else None) for f in _CLAIM_FIELDS}
        return _build(at, lambda: ClaimHolder(**texts))
    container = ContainerHolder(
        pod_uid=_text(doc, "pod_uid", at), namespace=_text(doc, "namespace", at), pod=_text(doc, "pod", at),
        container=_text(doc, "container", at), container_index=_whole(doc, "container_index", at, 0),
        init=_flag(doc, "init", at, False), memory_units=_maybe_whole(doc, "memory_units", at))
    return container


# format version 1: the same facts as a map of strings; numbers the agent read must be ASCII numbers. Every key
# gpumgr 1 wrote, and where it goes (`V1_META` is the whole mapping: a key not in it is refused, not dropped)
_META_NUMBERS = {"created": r"[0-9]{1,12}(\.[0-9]{0,9})?", "memory_units": r"-?[0-9]{1,10}",
                 "container_index": r"[0-9]{1,7}", "answered_memory_mib": r"[0-9]{1,13}",
                 "guess_of": r"[0-9]{1,7}"}
V1_META = frozenset({*_META_NUMBERS, "pod_uid", "namespace", "pod", "container", "init", "verified", "rides_on",
                     "ids", "claim", "claim_uid", "front_end", "request", "device", "share_id"})


def _from_meta(base: dict[str, Any], meta: object, where: str, reserve: bool) -> Allocation:
    """A format version 1 allocation (its labels a map of strings) as the typed record, built through the same
    constructors (and so the same bounds) as a version 2 one."""
    if not isinstance(meta, dict) or len(meta) > _MAX_META or not all(isinstance(v, str) for v in meta.values()):
        raise LedgerError(f"{where}: meta must be an object of at most {_MAX_META} text values")
    unknown = sorted(str(k) for k in meta if k not in V1_META)
    if unknown:
        raise LedgerError(f"{where}: unknown field meta.{_clip(unknown[0])}")
    numbers: dict[str, int | None] = {}
    for name, pattern in _META_NUMBERS.items():
        text = meta.get(name)
        if text is not None and not re.fullmatch(pattern, text, flags=re.ASCII):
            raise LedgerError(f"{where}: meta.{name} must be an ASCII number, got {_clip(repr(text), 40)}")
        # whole seconds of `created` by its digits (a float would round 999999999999.9999 up past the bound)
        numbers[name] = int(text.partition(".")[0]) if text else None
    units, guess = numbers["memory_units"], numbers["guess_of"]
    text = {k: v for k, v in meta.items() if k not in _META_NUMBERS}
    at = f"{where}: meta"
    holder: Holder | None = None
    if text.get("claim") or text.get("front_end") == "dra":
        ns, _, name = text.get("claim", "").partition("/")
        holder = _build(at, lambda: ClaimHolder(
            uid=text.get("claim_uid", ""), namespace=ns or text.get("namespace", ""), name=name,
            pod=text.get("pod", ""), pod_uid=text.get("pod_uid", ""), request=text.get("request", ""),
            device=text.get("device", ""), share_id=text.get("share_id", "")))
    elif text.get("pod_uid") or text.get("pod"):
        holder = _build(at, lambda: ContainerHolder(
            pod_uid=text.get("pod_uid", ""), namespace=text.get("namespace", ""), pod=text.get("pod", ""),
            container=text.get("container", ""), container_index=numbers["container_index"] or 0,
            init=text.get("init") == "true", memory_units=units if units is not None and units >= 0 else None))
    return _build(at, lambda: Allocation(
        **base, holder=holder, verified=text.get("verified") == "true", reserve=reserve,
        rides_on=text.get("rides_on") or None,
        ids=tuple(d for d in text.get("ids", "").split(",") if d), created=numbers["created"],
        answered_memory_mib=numbers["answered_memory_mib"],
        # gpumgr 1 wrote guess_of only for a guess among two or more
        guess_of=None if guess is None else max(2, guess)))
