"""What a MIG-capable card offers and holds, as the node sees it (read from NVML or the simulated backend)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class MigError(Exception):
    """A MIG operation the card refused; the message says which card, profile and placement, and why."""


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile: `id` is what create and placements take (not NVML's profile enum)."""

    id: int
    name: str  # e.g. "1g.10gb" (no "MIG " prefix)
    slices: int  # compute slices
    memory_slices: int  # placement size
    memory_mib: int
    max_count: int
    multiprocessors: int = 0
    starts: tuple[int, ...] = ()  # possible placement starts, in memory slices

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "slices": self.slices, "memory_slices": self.memory_slices,
                "memory_mib": self.memory_mib, "max_count": self.max_count, "multiprocessors": self.multiprocessors,
                "starts": list(self.starts)}


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance with its one full-size compute instance (the only shape gpumgr creates or adopts as
    usable: a GI split into several CIs is reported as `foreign`)."""

    card: int
    gi: int
    ci: int
    profile_id: int
    profile: str
    start: int
    size: int
    memory_mib: int
    uuid: str  # MIG-<uuid>, new on every re-create
    foreign: bool = False  # not a shape gpumgr uses (several CIs, or a partial CI)

    @property
    def usable(self) -> bool:
        """A GI with its one full-size CI (a GI without a CI, `uuid` empty, is a creation cut short)."""
        return bool(self.uuid) and not self.foreign

    @property
    def name(self) -> str:
        """The ledger's name of the instance: `mig-<card>-<gi>`."""
        return instance_name(self.card, self.gi)

    def overlaps(self, start: int, size: int) -> bool:
        return start < self.start + self.size and self.start < start + size


def instance_name(card: int, gi: int) -> str:
    return f"mig-{card}-{gi}"


@dataclass(frozen=True)
class MigCard:
    """One MIG-capable card: its mode, its profiles, and the instances that exist on it now."""

    index: int
    enabled: bool
    pending: bool
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    instances: tuple[MigInstance, ...] = field(default=())
    needs_reset: bool = True  # Ampere: a mode change waits for a GPU reset; Hopper and later switch at once

    def profile(self, key: int | str) -> MigProfile | None:
        return next((p for p in self.profiles if p.id == key or p.name == key), None)

    def free_starts(self, profile: MigProfile) -> tuple[int, ...]:
        """Placements of `profile` that no instance overlaps and that the card's compute slices and the
        profile's instance limit still allow (what NVML would create now)."""
        if not self.enabled:
            return ()
        used = sum(self._slices(i) for i in self.instances)
        same = sum(1 for i in self.instances if i.profile_id == profile.id)
        if used + profile.slices > self.compute_slices or same >= profile.max_count:
            return ()
        return tuple(s for s in profile.starts
                     if not any(i.overlaps(s, profile.memory_slices) for i in self.instances))

    def _slices(self, inst: MigInstance) -> int:
        p = self.profile(inst.profile_id)
        return p.slices if p else 0
