"""The MIG part of the node inventory annotation: each MIG-enabled card's profiles, placements and instances.

Published by the agent under `"mig"` in `gpumgr.io/gpu-inventory` (see inventory.py), read by the extender:
    {"prefix": "nvidia.com/mig-",
     "cards": [{"index": 0, "compute_slices": 7, "memory_slices": 8,
                "profiles": [{"name": "1g.10gb", "id": 19, "slices": 1, "memory_slices": 1, "max_count": 7,
                              "starts": [0, 1, 2, 3, 4, 5, 6]}, ...],
                "instances": [{"profile": "1g.10gb", "start": 0, "size": 1, "origin": "layout"}, ...]}]}
`origin` is the ledger's: `layout` (a static instance the device plugins serve), `claim` (made for a DRA claim),
`adopted`. Every list and number is bounded; a malformed section makes the whole annotation unusable (inventory.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_CARDS = 64
MAX_PROFILES = 32
MAX_SLICES = 16  # memory or compute slices of one card (8 on A100/H100)
MAX_PREFIX = 253
PROFILE = re.compile(r"[0-9]{1,2}g\.[0-9]{1,4}gb(\+me)?\Z")


class MigSectionError(ValueError):
    pass


@dataclass(frozen=True)
class MigProfileView:
    name: str
    id: int
    slices: int  # compute slices
    memory_slices: int  # placement size
    max_count: int
    starts: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "slices": self.slices, "memory_slices": self.memory_slices,
                "max_count": self.max_count, "starts": list(self.starts)}


@dataclass(frozen=True)
class MigInstanceView:
    profile: str
    start: int
    size: int
    origin: str  # layout | claim | adopted

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start, "size": self.size, "origin": self.origin}


@dataclass(frozen=True)
class MigCardView:
    index: int
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfileView, ...]
    instances: tuple[MigInstanceView, ...]

    def profile(self, key: int | str) -> MigProfileView | None:
        return next((p for p in self.profiles if p.id == key or p.name == key), None)

    def free_starts(self, profile: MigProfileView, taken: Iterable[tuple[str, int, int]] = ()) -> tuple[int, ...]:
        """Placements of `profile` nothing overlaps, where the compute slices and the profile's instance limit
        allow one more: counting the card's instances and `taken` ((profile, start, size) each, e.g. DRA claims
        the agent has not made yet)."""
        used = [(i.profile, i.start, i.size) for i in self.instances]
        used += [t for t in taken if t not in used]
        slices = sum(p.slices for name, _s, _n in used if (p := self.profile(name)) is not None)
        same = sum(1 for name, _s, _n in used if name == profile.name)
        if slices + profile.slices > self.compute_slices or same >= profile.max_count:
            return ()
        return tuple(s for s in profile.starts
                     if not any(s < start + size and start < s + profile.memory_slices for _p, start, size in used))

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "compute_slices": self.compute_slices, "memory_slices": self.memory_slices,
                "profiles": [p.to_json() for p in self.profiles], "instances": [i.to_json() for i in self.instances]}


@dataclass(frozen=True)
class NodeMig:
    prefix: str  # the resource-name prefix of the device plugins: <prefix><profile>
    cards: tuple[MigCardView, ...]

    def card(self, index: int) -> MigCardView | None:
        return next((c for c in self.cards if c.index == index), None)

    def static_count(self, profile: str) -> int:
        """Instances of `profile` the device plugins serve (the static layout's and adopted ones)."""
        return sum(1 for c in self.cards for i in c.instances if i.profile == profile and i.origin != "claim")

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "cards": [c.to_json() for c in self.cards]}

    @classmethod
    def from_json(cls, doc: Any) -> NodeMig:
        d = _obj(doc, "mig")
        prefix = d.get("prefix")
        if not isinstance(prefix, str) or not 0 < len(prefix) <= MAX_PREFIX:
            raise MigSectionError(f"mig.prefix must be text of 1..{MAX_PREFIX} characters")
        cards = _list(d.get("cards"), "mig.cards", MAX_CARDS)
        return cls(prefix=prefix, cards=tuple(_card(c, f"mig.cards[{k}]") for k, c in enumerate(cards)))


def _card(doc: Any, where: str) -> MigCardView:
    d = _obj(doc, where)
    memory_slices = _int(d.get("memory_slices"), f"{where}.memory_slices", 1, MAX_SLICES)
    profiles = tuple(_profile(p, f"{where}.profiles[{k}]", memory_slices)
                     for k, p in enumerate(_list(d.get("profiles"), f"{where}.profiles", MAX_PROFILES)))
    instances = tuple(_instance(i, f"{where}.instances[{k}]", memory_slices)
                      for k, i in enumerate(_list(d.get("instances"), f"{where}.instances", MAX_SLICES)))
    return MigCardView(index=_int(d.get("index"), f"{where}.index", 0, 999_999),
                       compute_slices=_int(d.get("compute_slices"), f"{where}.compute_slices", 1, MAX_SLICES),
                       memory_slices=memory_slices, profiles=profiles, instances=instances)


def _profile(doc: Any, where: str, memory_slices: int) -> MigProfileView:
    d = _obj(doc, where)
    name = _name(d.get("name"), f"{where}.name")
    size = _int(d.get("memory_slices"), f"{where}.memory_slices", 1, memory_slices)
    starts = tuple(_int(s, f"{where}.starts", 0, memory_slices - size)
                   for s in _list(d.get("starts"), f"{where}.starts", MAX_SLICES))
    return MigProfileView(name=name, id=_int(d.get("id"), f"{where}.id", 0, 99),
                          slices=_int(d.get("slices"), f"{where}.slices", 1, MAX_SLICES), memory_slices=size,
                          max_count=_int(d.get("max_count"), f"{where}.max_count", 1, MAX_SLICES), starts=starts)


def _instance(doc: Any, where: str, memory_slices: int) -> MigInstanceView:
    d = _obj(doc, where)
    size = _int(d.get("size"), f"{where}.size", 1, memory_slices)
    origin = d.get("origin")
    if origin not in ("layout", "claim", "adopted"):
        raise MigSectionError(f"{where}.origin must be layout, claim or adopted")
    return MigInstanceView(profile=_name(d.get("profile"), f"{where}.profile"),
                           start=_int(d.get("start"), f"{where}.start", 0, memory_slices - size), size=size,
                           origin=str(origin))


def _obj(doc: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise MigSectionError(f"{where} must be an object")
    return doc


def _list(doc: Any, where: str, most: int) -> list[Any]:
    if not isinstance(doc, list) or len(doc) > most:
        raise MigSectionError(f"{where} must be a list of at most {most}")
    return doc


def _int(v: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise MigSectionError(f"{where} must be a whole number {lo}..{hi}, got {repr(v)[:40]}")
    return v


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not PROFILE.match(v):
        raise MigSectionError(f"{where} must be a MIG profile name such as 1g.10gb, got {repr(v)[:40]}")
    return v
