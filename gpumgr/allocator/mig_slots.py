"""MIG instances as the ledger holds them: one slot per instance the node made (or adopted), named by its card
and placement so that the name is known before NVML creates it (`mig-<card>-<start>`).

A slot with no UUID is a creation in flight: written to the checkpoint *before* NVML is asked, so that after a
crash between create and checkpoint the instance NVML shows is found by its placement and adopted or destroyed
(gpumgr/mig/reconcile.py), never leaked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ORIGINS = ("layout", "claim", "adopted")  # the static layout of the device plugins, a DRA claim, found after a crash
_NAME = re.compile(r"mig-([0-9]{1,4})-([0-9]{1,2})\Z")
_FIELDS = frozenset({"card", "start", "size", "profile_id", "profile", "memory_mib", "gi", "ci", "uuid", "origin"})
_MAX_TEXT = 128


class SlotError(ValueError):
    """A malformed MIG slot (in a checkpoint or from a caller)."""


def slot_name(card: int, start: int) -> str:
    return f"mig-{card}-{start}"


def parse_slot_name(name: str) -> tuple[int, int] | None:
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class MigSlot:
    card: int
    start: int  # memory slice
    size: int  # memory slices
    profile_id: int
    profile: str  # e.g. "1g.10gb"
    memory_mib: int
    origin: str = "layout"
    gi: int | None = None  # None until NVML made it
    ci: int | None = None
    uuid: str = ""  # MIG-<uuid>; empty: creation in flight

    def __post_init__(self) -> None:
        for name, hi in (("card", 1024), ("start", 16), ("size", 17), ("profile_id", 64), ("memory_mib", 1 << 30)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < hi:
                raise SlotError(f"MIG slot: {name} must be a whole number 0..{hi - 1}, got {repr(v)[:40]}")
        for name in ("gi", "ci"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 64):
                raise SlotError(f"MIG slot: {name} must be a whole number 0..63, got {repr(v)[:40]}")
        for name in ("profile", "uuid"):
            v = getattr(self, name)
            if not isinstance(v, str) or len(v) > _MAX_TEXT:
                raise SlotError(f"MIG slot: {name} must be text of at most {_MAX_TEXT} characters")
        if self.origin not in ORIGINS:
            raise SlotError(f"MIG slot: origin must be one of {', '.join(ORIGINS)}, got {repr(self.origin)[:40]}")
        if self.size == 0:
            raise SlotError("MIG slot: size must be at least one memory slice")

    @property
    def name(self) -> str:
        return slot_name(self.card, self.start)

    @property
    def ready(self) -> bool:
        """NVML made it (a UUID is known); False: a creation in flight."""
        return bool(self.uuid)

    def overlaps(self, other: MigSlot) -> bool:
        return self.card == other.card and self.start < other.start + other.size \
            and other.start < self.start + self.size

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"card": self.card, "start": self.start, "size": self.size,
                               "profile_id": self.profile_id, "profile": self.profile,
                               "memory_mib": self.memory_mib, "origin": self.origin}
        if self.gi is not None:
            doc.update(gi=self.gi, ci=self.ci, uuid=self.uuid)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MigSlot:
        if not isinstance(doc, Mapping):
            raise SlotError("MIG slot must be an object")
        unknown = sorted(str(k) for k in doc if k not in _FIELDS)
        if unknown:
            raise SlotError(f"MIG slot: unknown field {unknown[0][:80]!r}")
        try:
            return cls(card=doc["card"], start=doc["start"], size=doc["size"], profile_id=doc["profile_id"],
                       profile=doc["profile"], memory_mib=doc["memory_mib"], origin=doc.get("origin", "layout"),
                       gi=doc.get("gi"), ci=doc.get("ci"), uuid=doc.get("uuid", ""))
        except KeyError as e:
            raise SlotError(f"MIG slot: missing field {e.args[0]}") from None
