"""Making and unmaking MIG instances through the ledger and the checkpoint, in the order that survives a kill -9
at any point:

  create:   1. checkpoint a slot in flight (no UUID)   2. NVML creates GI + CI   3. checkpoint the UUID
  destroy:  1. NVML destroys (refused while the slot is held)                    2. checkpoint without the slot
  start:    `reconcile`: adopt what 2 made before 3, forget what 1 wrote but 2 never made, destroy instances
            nobody recorded (docs/mig.md, gpumgr/mig/reconcile.py)

Blocking (NVML and the checkpoint's fsyncs): the agent runs it off its event loop. `commit(change)` applies
`change` to a copy of the ledger, writes the checkpoint and makes the copy live (NodeState's rule); `ledger()`
reads the live one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from gpumgr.allocator.ledger import Ledger, LedgerError
from gpumgr.allocator.mig_slots import MigSlot, slot_name
from gpumgr.devices.backend import MigBackend
from gpumgr.mig import reconcile as rec
from gpumgr.mig.types import MigCard, MigError, MigInstance

log = logging.getLogger("gpumgr.mig")
T = TypeVar("T")
Commit = Callable[[Callable[[Ledger], Any]], Any]


class MigManager:
    def __init__(self, backend: MigBackend, commit: Commit, ledger: Callable[[], Ledger]):
        self._backend = backend
        self._commit = commit
        self._ledger = ledger

    def cards(self) -> tuple[MigCard, ...]:
        return self._backend.mig_cards()

    def backend_create(self, card: int, profile_id: int, start: int) -> MigInstance:
        """NVML alone, for a front end that commits its own steps around it (dra/mig_prepare.py)."""
        return self._backend.mig_create(card, profile_id, start)

    def backend_destroy(self, card: int, gi: int) -> bool:
        return self._backend.mig_destroy(card, gi)

    def reconcile(self, keep: Callable[[MigInstance], bool] | None = None) -> rec.Plan:
        """Bring the ledger and NVML together (at every start, before any front end serves)."""
        cards = self._backend.mig_cards()
        p = rec.plan(self._ledger(), cards, keep)
        kept: list[MigInstance] = []
        for inst in p.destroy:
            try:
                self._backend.mig_destroy(inst.card, inst.gi)
            except MigError as e:
                log.error("%s; adopting it so that nothing runs there unseen", e)
                if inst.usable:
                    kept.append(inst)
        if kept:  # could not destroy: it stays in the ledger instead (origin "adopted")
            names = {slot_name(i.card, i.start) for i in kept}
            again = rec.plan(self._ledger(), cards, lambda i: slot_name(i.card, i.start) in names
                             or (keep is not None and keep(i)))
            p.adopt = again.adopt
            p.destroy = [i for i in p.destroy if slot_name(i.card, i.start) not in names]
        for line in p.lines():
            log.info("%s", line)
        modes = {c.index: c.enabled for c in cards}

        def change(led: Ledger) -> list[str]:
            for i, on in modes.items():
                led.set_mig_mode(i, on)
            released = rec.apply_to_ledger(led, p)
            for key in released:
                log.warning("released %s: its MIG instance is gone", key)
            return released

        self._commit(change)
        return p

    def create(self, card: int, profile: int | str, start: int, origin: str = "layout") -> MigSlot:
        """A new instance of `profile` (id or name) at memory slice `start` on `card`, recorded in the ledger.
        MigError (the card refused; nothing left behind) or LedgerError (the ledger refuses the placement)."""
        info = next((c for c in self._backend.mig_cards() if c.index == card), None)
        prof = info.profile(profile) if info else None
        if info is None or prof is None:
            raise MigError(f"card {card} has no MIG profile {profile}")
        if start not in prof.starts:
            raise MigError(f"card {card}: {prof.name} cannot start at memory slice {start} (placements: "
                           f"{', '.join(map(str, prof.starts))})")
        if not info.enabled:
            raise MigError(f"card {card}: MIG mode is off (enable it first)")
        pending = MigSlot(card=card, start=start, size=prof.memory_slices, profile_id=prof.id, profile=prof.name,
                          memory_mib=prof.memory_mib, origin=origin)
        self._commit(lambda led: led.add_slot(pending))  # 1: in flight, before NVML is asked
        try:
            inst = self._backend.mig_create(card, prof.id, start)  # 2
        except MigError:
            self._commit(lambda led: led.remove_slot(pending.name))
            raise
        made = MigSlot(card=card, start=start, size=prof.memory_slices, profile_id=prof.id, profile=prof.name,
                       memory_mib=inst.memory_mib, origin=origin, gi=inst.gi, ci=inst.ci, uuid=inst.uuid)
        self._commit(lambda led: led.update_slot(made))  # 3
        log.info("MIG card %d: created %s at memory slice %d (GI %d, %s)", card, prof.name, start, inst.gi,
                 inst.uuid)
        return made

    def set_mode(self, card: int, enabled: bool) -> str:
        """MIG on or off: "done" (the ledger learns it) or "reset required" (Ampere: after the next GPU reset)."""
        outcome = self._backend.mig_set_mode(card, enabled)
        if outcome == "done":
            self._commit(lambda led: led.set_mig_mode(card, enabled))
        log.info("MIG card %d: mode %s: %s", card, "on" if enabled else "off", outcome)
        return outcome

    def destroy(self, name: str) -> bool:
        """Destroy the instance of slot `name` (LedgerError while an allocation lives in it); False if there was
        no such slot."""
        slot = self._ledger().slots.get(name)
        if slot is None:
            return False
        holders = self._ledger().slot_holders.get(name)
        if holders:
            raise LedgerError(f"MIG instance {name} is held by {sorted(holders)[0]}")
        if slot.gi is not None:
            self._backend.mig_destroy(slot.card, slot.gi)  # 1
        self._commit(lambda led: led.remove_slot(name))  # 2
        log.info("MIG card %d: destroyed %s at memory slice %d", slot.card, slot.profile, slot.start)
        return True
