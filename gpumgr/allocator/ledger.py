"""The ledger: per card free cores, free memory, who holds what, and health.

The single source of truth for allocation state on a node. Every change goes through `assign` or `release`;
both are all-or-nothing. Card state (free, shared, exclusive) is derived from the allocations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
    def from_json(cls, doc: Mapping[str, Any]) -> Ledger:
        try:
            cards = sorted(doc["cards"], key=lambda c: int(c["index"]))
            if [int(c["index"]) for c in cards] != list(range(len(cards))):
                raise LedgerError("card indices are not 0..N-1")
            ledger = cls(int(c["memory_mib"]) for c in cards)
            for a in doc["allocations"]:
                ledger.assign(Allocation.from_json(a), check_health=False)
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
class Allocation:
    """What one holder (a container, or a pod in `place`) took: cards, cores asked, memory asked, and labels."""

    key: str
    cards: tuple[int, ...]
    cores: int
    memory_mib: int = 0
    meta: Mapping[str, str] = field(default_factory=dict)
    # False: a container reusing devices its pod already reserved (an app container on an init container's
    # devices, or the other way round); it is recorded, but takes nothing from the cards itself
    reserve: bool = True

    def holding_on(self, card: CardState) -> Holding:
        if not self.reserve:
            return Holding(cores=0, memory_mib=0)
        if self.cores >= HUNDRED:
            return Holding(cores=HUNDRED, memory_mib=card.memory_mib)
        return Holding(cores=self.cores, memory_mib=self.memory_mib)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "key": self.key,
            "cards": list(self.cards),
            "cores": self.cores,
            "memory_mib": self.memory_mib,
            "meta": dict(self.meta),
        }
        if not self.reserve:
            doc["reserve"] = False
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Allocation:
        meta = doc.get("meta") or {}
        if not isinstance(meta, dict):
            raise LedgerError("allocation meta must be an object")
        return cls(
            key=str(doc["key"]),
            cards=tuple(int(c) for c in doc["cards"]),
            cores=int(doc["cores"]),
            memory_mib=int(doc.get("memory_mib", 0)),
            meta={str(k): str(v) for k, v in meta.items()},
            reserve=bool(doc.get("reserve", True)),
        )
