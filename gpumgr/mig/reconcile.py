"""After a start: the ledger's MIG slots against the instances NVML says exist. Pure: `plan` says what to do,
the manager does it. Every instance ends up either in the ledger or destroyed (never leaked); every slot ends up
backed by an instance or forgotten.

  NVML instance, slot at its placement, same profile:
      slot made (same UUID)            keep
      slot in flight (no UUID)         adopt: the crash came between NVML's create and the checkpoint
      slot made, other UUID            adopt the new UUID (someone re-created it), logged
  NVML instance, no slot (or another profile there)
      `keep(instance)` says so         adopt (origin "adopted"; the static layout wants it)
      otherwise                        destroy
  NVML GI without a compute instance   destroy (a creation cut short before its CI; its slot is forgotten)
  NVML instance of several CIs         leave alone (not a layout gpumgr makes: an operator's), logged
  slot with no instance                forget it (in flight: never made; made: lost, and its holders released)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpumgr.allocator.ledger import Ledger
from gpumgr.allocator.mig_slots import MigSlot, slot_name
from gpumgr.mig.types import MigCard, MigInstance


def plan(ledger: Ledger, cards: Iterable[MigCard], keep: Callable[[MigInstance], bool] | None = None) -> Plan:
    out = Plan()
    seen: set[str] = set()
    for card in cards:
        for inst in card.instances:
            name = slot_name(inst.card, inst.start)
            slot = ledger.slots.get(name)
            if inst.foreign:
                out.foreign.append(inst)
                if slot is not None:
                    seen.add(name)  # the placement is taken either way: the slot stays for whoever holds it
                continue
            if not inst.usable:
                out.destroy.append(inst)
                continue
            if slot is not None and slot.profile_id == inst.profile_id:
                seen.add(name)
                if slot.uuid == inst.uuid and slot.gi == inst.gi:
                    out.keep.append(slot)
                else:
                    out.adopt.append(_made(slot, inst))
                continue
            if keep is not None and keep(inst):
                out.adopt.append(MigSlot(card=inst.card, start=inst.start, size=inst.size,
                                         profile_id=inst.profile_id, profile=inst.profile,
                                         memory_mib=inst.memory_mib, origin="adopted", gi=inst.gi, ci=inst.ci,
                                         uuid=inst.uuid))
            else:
                out.destroy.append(inst)
    out.forget = [s for n, s in sorted(ledger.slots.items()) if n not in seen]
    return out


def apply_to_ledger(ledger: Ledger, p: Plan) -> list[str]:
    """The ledger side of a plan (after its destroys were done): forget what is gone, releasing its holders,
    and record what was adopted. Returns the keys of the allocations released."""
    released: list[str] = []
    for slot in p.forget:
        for key in list(ledger.slot_holders.get(slot.name, {})):
            ledger.release(key)
            released.append(key)
        ledger.remove_slot(slot.name)
    for slot in p.adopt:
        if slot.name in ledger.slots and ledger.slots[slot.name].profile_id == slot.profile_id:
            ledger.update_slot(slot)
        else:
            if slot.name in ledger.slots:  # another profile was recorded there: that one is gone
                for key in list(ledger.slot_holders.get(slot.name, {})):
                    ledger.release(key)
                    released.append(key)
                ledger.remove_slot(slot.name)
            ledger.add_slot(slot)
    return released


def _made(slot: MigSlot, inst: MigInstance) -> MigSlot:
    return MigSlot(card=slot.card, start=slot.start, size=slot.size, profile_id=slot.profile_id,
                   profile=slot.profile, memory_mib=inst.memory_mib, origin=slot.origin, gi=inst.gi, ci=inst.ci,
                   uuid=inst.uuid)


@dataclass
class Plan:
    keep: list[MigSlot] = field(default_factory=list)
    adopt: list[MigSlot] = field(default_factory=list)
    destroy: list[MigInstance] = field(default_factory=list)
    forget: list[MigSlot] = field(default_factory=list)
    foreign: list[MigInstance] = field(default_factory=list)

    @property
    def changes_ledger(self) -> bool:
        return bool(self.adopt or self.forget)

    def lines(self) -> list[str]:
        """One log line per action, naming the card, the placement and the profile."""
        out = [f"MIG card {s.card}: adopted {s.profile} at memory slice {s.start} ({s.uuid})" for s in self.adopt]
        out += [f"MIG card {i.card}: destroying {i.profile} at memory slice {i.start} (GI {i.gi}): no holder in the "
                "ledger" for i in self.destroy]
        out += [f"MIG card {s.card}: forgot {s.profile} at memory slice {s.start}: NVML has no such instance"
                for s in self.forget]
        out += [f"MIG card {i.card}: left {i.profile} at memory slice {i.start} (GI {i.gi}) alone: several compute "
                "instances, not a layout gpumgr makes" for i in self.foreign]
        return out
