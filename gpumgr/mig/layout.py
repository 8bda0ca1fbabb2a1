"""Static MIG layouts for the device-plugin front end: which instances each card should have.

A layout is chosen by name: from the node label `nvidia.com/mig.config` (the label NVIDIA's MIG manager
watches), else from the agent's configuration. Names:
  all-<profile>     every MIG-capable card filled with that profile (e.g. all-1g.10gb: seven per A100/H100)
  all-balanced      every card: two 1g, one 2g, one 3g of its own sizes (A30: two 1g, one 2g)
  all-disabled      no instances (MIG mode is left as it is)
  <configured>      the agent configuration's `mig_layouts: {name: {"all" | "<card>": [profile, ...]}}`
Placements are first fit, largest profile first, in NVML's placement order. A layout is applied only to a card
nothing holds (no allocation on it, none in its instances); elsewhere it is refused, and `Report` says why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumgr.allocator.ledger import Ledger
from gpumgr.mig.types import MigCard, MigProfile

LABEL = "nvidia.com/mig.config"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,62}\Z")
_MAX_PER_CARD = 16


class LayoutError(ValueError):
    """A layout name or configuration that cannot be used; the message names it."""


@dataclass(frozen=True)
class Layout:
    name: str
    fill: str | None = None  # all-<profile>
    balanced: bool = False
    cards: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "all" or a card index -> profiles

    def wanted(self, card: MigCard) -> tuple[str, ...] | None:
        """Profile names for `card` (None: the layout says nothing about it)."""
        if self.fill is not None:
            p = card.profile(self.fill)
            return (self.fill,) * (p.max_count if p else 1)
        if self.balanced:
            small = sorted(card.profiles, key=lambda p: (p.slices, p.memory_slices, "+me" in p.name))
            by_slices = {p.slices: p.name for p in reversed(small) if "+me" not in p.name}
            names = [by_slices[1], by_slices[1], by_slices[2]]
            if 3 in by_slices:
                names.append(by_slices[3])
            return tuple(names)
        return self.cards.get(str(card.index), self.cards.get("all"))


def chosen(labels: Mapping[str, str], configured_default: str | None) -> str | None:
    """The layout the operator asks for: the node label wins over the agent's configuration."""
    return labels.get(LABEL) or configured_default


def parse(name: str, configured: Mapping[str, Any] | None = None) -> Layout:
    if not isinstance(name, str) or not _NAME.match(name):
        raise LayoutError(f"MIG layout name {name!r:.80}: letters, digits, '.', '_', '+', '-', at most 63")
    if configured and name in configured:
        return _configured(name, configured[name])
    if name == "all-disabled":
        return Layout(name=name, cards={"all": ()})
    if name == "all-balanced":
        return Layout(name=name, balanced=True)
    if name.startswith("all-") and re.fullmatch(r"[1-8]g\.[0-9]{1,3}gb(\+me)?", name[4:]):
        return Layout(name=name, fill=name[4:])
    known = ", ".join(sorted([*(configured or {}), "all-<profile>", "all-balanced", "all-disabled"]))
    raise LayoutError(f"unknown MIG layout {name!r}; known: {known}")


def _configured(name: str, doc: object) -> Layout:
    if not isinstance(doc, Mapping) or len(doc) > 1024:
        raise LayoutError(f"MIG layout {name}: must map \"all\" or card indices to lists of profiles")
    cards: dict[str, tuple[str, ...]] = {}
    for key, profiles in doc.items():
        if not (key == "all" or (isinstance(key, str | int) and str(key).isdigit() and int(key) < 1024)):
            raise LayoutError(f"MIG layout {name}: {str(key)!r:.40} is neither \"all\" nor a card index")
        if not isinstance(profiles, Sequence) or isinstance(profiles, str) or len(profiles) > _MAX_PER_CARD \
                or not all(isinstance(p, str) and len(p) <= 32 for p in profiles):
            raise LayoutError(f"MIG layout {name}, card {key}: a list of at most {_MAX_PER_CARD} profile names")
        cards[str(key)] = tuple(profiles)
    return Layout(name=name, cards=cards)


def place(card: MigCard, names: Sequence[str]) -> list[tuple[MigProfile, int]]:
    """First-fit placements of `names` on an empty `card`, largest first; LayoutError naming what does not fit."""
    wanted = []
    for n in names:
        p = card.profile(n)
        if p is None:
            have = ", ".join(q.name for q in card.profiles)
            raise LayoutError(f"card {card.index} has no MIG profile {n} (it has {have})")
        wanted.append(p)
    chosen: list[tuple[MigProfile, int]] = []
    used: list[tuple[int, int]] = []
    for p in sorted(wanted, key=lambda p: (-p.memory_slices, -p.slices)):
        if sum(q.slices for q, _ in chosen) + p.slices > card.compute_slices \
                or sum(1 for q, _ in chosen if q.id == p.id) >= p.max_count:
            raise LayoutError(f"card {card.index}: {', '.join(names)} does not fit ({p.name} has no compute "
                              "slices left)")
        start = next((s for s in p.starts if all(s + p.memory_slices <= a or b <= s for a, b in used)), None)
        if start is None:
            raise LayoutError(f"card {card.index}: {', '.join(names)} does not fit ({p.name} has no free placement)")
        chosen.append((p, start))
        used.append((start, start + p.memory_slices))
    return sorted(chosen, key=lambda c: c[1])


def card_busy(ledger: Ledger, index: int) -> str | None:
    """Why the layout of card `index` may not change now, or None."""
    c = ledger.card(index)
    if c.holders:
        return f"card {index} is held outside MIG by {sorted(c.holders)[0]}"
    held = sorted(n for n in c.slots if ledger.slot_holders.get(n))
    if held:
        key = sorted(ledger.slot_holders[held[0]])[0]
        a = ledger.allocations.get(key)
        claim = a.claim if a is not None else None
        who = (f"claim {claim.namespace}/{claim.name}" if claim is not None
               else f"pod {a.namespace}/{a.pod}" if a is not None and a.pod else key)
        more = f" (and {len(held) - 1} more instances)" if len(held) > 1 else ""
        return f"card {index}: MIG instance {held[0]} is in use by {who}{more}"
    return None


@dataclass
class Report:
    """What applying a layout did and refused: one line each, for the log and `gpumgr status`."""

    done: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
