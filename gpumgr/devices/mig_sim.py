"""MIG on the simulated node: the same rules as NVML (placements in memory slices, no overlap, the compute-slice
and per-profile limits, a reset on Ampere to change the mode), kept in memory; the instances are the "hardware",
so a test restarting the agent hands the same `SimulatedMig` to the new one."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace

from gpumgr.devices.types import Inventory
from gpumgr.mig.profiles import FAMILIES
from gpumgr.mig.types import MigCard, MigError, MigInstance


class SimulatedMig:
    def __init__(self, inventory: Inventory, families: dict[int, str], enabled: set[int] | None = None):
        self._lock = threading.Lock()
        self._cards: dict[int, MigCard] = {}
        for index, key in families.items():
            fam = FAMILIES.get(key)
            if fam is None or not 0 <= index < inventory.count:
                raise ValueError(f"card {index}: unknown MIG family {key!r}; one of {', '.join(FAMILIES)}")
            on = index in (enabled or set())
            self._cards[index] = MigCard(index=index, enabled=on, pending=on, memory_slices=fam.memory_slices,
                                         compute_slices=fam.compute_slices,
                                         profiles=fam.profiles(inventory.gpus[index].memory_mib),
                                         needs_reset=not fam.hopper)
        self.fail_next: str | None = None  # a test makes the next create fail with this message

    def cards(self) -> tuple[MigCard, ...]:
        with self._lock:
            return tuple(self._cards[i] for i in sorted(self._cards))

    def create(self, index: int, profile_id: int, start: int) -> MigInstance:
        with self._lock:
            card = self._card(index)
            p = card.profile(profile_id)
            where = f"card {index}: profile {profile_id} at memory slice {start}"
            if p is None or start not in p.starts:
                raise MigError(f"{where}: no such profile or placement on this card")
            if not card.enabled:
                raise MigError(f"{where}: MIG mode is off on this card (or MIG not supported)")
            if self.fail_next:
                msg, self.fail_next = self.fail_next, None
                raise MigError(f"{where}: {msg}")
            if start not in card.free_starts(p):
                raise MigError(f"{where}: the placement is occupied (another instance overlaps it) or the card's "
                               "slices are used up")
            used = {i.gi for i in card.instances}
            gi = 0 if p.slices == card.compute_slices and 0 not in used else \
                next(k for k in range(1, 15) if k not in used)
            inst = MigInstance(card=index, gi=gi, ci=0, profile_id=p.id, profile=p.name, start=start,
                               size=p.memory_slices, memory_mib=p.memory_mib, uuid=f"MIG-{uuid.uuid4()}")
            self._cards[index] = replace(card, instances=tuple(sorted((*card.instances, inst), key=lambda i: i.gi)))
            return inst

    def destroy(self, index: int, gi: int) -> bool:
        with self._lock:
            card = self._card(index)
            keep = tuple(i for i in card.instances if i.gi != gi)
            self._cards[index] = replace(card, instances=keep)
            return len(keep) != len(card.instances)

    def set_mode(self, index: int, enabled: bool) -> str:
        with self._lock:
            card = self._card(index)
            if not enabled and card.instances:
                raise MigError(f"card {index}: MIG mode not changed: in use (instances exist): destroy them first")
            now = card.enabled if card.needs_reset else enabled
            self._cards[index] = replace(card, pending=enabled, enabled=now)
            return "done" if now == enabled else "reset required"

    def reset(self, index: int) -> None:
        """A GPU reset: the pending mode becomes current."""
        with self._lock:
            card = self._card(index)
            self._cards[index] = replace(card, enabled=card.pending)

    def _card(self, index: int) -> MigCard:
        card = self._cards.get(index)
        if card is None:
            raise MigError(f"card {index} is not MIG-capable")
        return card
