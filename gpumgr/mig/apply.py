"""Applying a static MIG layout to the node's cards, through the manager (so every step is checkpointed and a
crash halfway is reconciled at the next start). Cards something holds are left alone and reported."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpumgr.allocator.ledger import Ledger, LedgerError
from gpumgr.allocator.mig_slots import slot_name
from gpumgr.mig.layout import Layout, LayoutError, Report, card_busy, place
from gpumgr.mig.manager import MigManager
from gpumgr.mig.types import MigCard, MigError, MigInstance

log = logging.getLogger("gpumgr.mig")


def apply_layout(manager: MigManager, ledger: Callable[[], Ledger], layout: Layout, quiet: bool = False) -> Report:
    """`quiet`: the summary and refusals at debug level (a retry that may refuse the same again)."""
    report = Report()
    for card in manager.cards():
        names = layout.wanted(card)
        if names is None:
            continue
        try:
            _apply_card(manager, ledger, layout, card, names, report)
        except (LayoutError, MigError, LedgerError) as e:
            report.refused.append(f"layout {layout.name}: {e}")
    for line in report.done:  # each create and destroy was logged as it happened
        log.debug("MIG %s", line)
    log.log(logging.DEBUG if quiet else logging.INFO, "MIG layout %s: %d changes or checks done, %d refused",
            layout.name, len(report.done), len(report.refused))
    for line in report.refused:
        log.log(logging.DEBUG if quiet else logging.WARNING, "MIG refused: %s", line)
    return report


def keeper(manager: MigManager, layout: Layout | None) -> Callable[[MigInstance], bool]:
    """For the start-up reconcile: an instance nobody recorded is adopted when the layout wants exactly it."""
    wanted: set[tuple[int, int, int]] = set()
    if layout is not None:
        for card in manager.cards():
            names = layout.wanted(card)
            try:
                wanted |= {(card.index, p.id, s) for p, s in place(card, names or ())}
            except LayoutError:
                continue
    return lambda i: (i.card, i.profile_id, i.start) in wanted


def _apply_card(manager: MigManager, ledger: Callable[[], Ledger], layout: Layout, card: MigCard,
                names: tuple[str, ...], report: Report) -> None:
    target = place(card, names)  # refuses a layout that cannot fit before anything is touched
    want = {(p.id, s) for p, s in target}
    led = ledger()
    have = {(s.profile_id, s.start) for s in led.slots.values() if s.card == card.index}
    if have == want and (card.enabled or not want):
        report.done.append(f"card {card.index}: layout {layout.name} already in place ({len(want)} instances)")
        return
    busy = card_busy(led, card.index)
    if busy:
        report.refused.append(f"layout {layout.name}: {busy}; left as it is")
        return
    if want and not card.enabled:
        outcome = manager.set_mode(card.index, True)
        if outcome != "done":
            report.refused.append(f"layout {layout.name}: card {card.index}: MIG mode is pending until the GPU "
                                  "is reset (Ampere): reset it (nvidia-smi -r) and the layout is applied at the "
                                  "agent's next start")
            return
    for s in sorted((s for s in led.slots.values() if s.card == card.index), key=lambda s: s.start):
        if (s.profile_id, s.start) not in want:
            manager.destroy(s.name)
            report.done.append(f"card {card.index}: destroyed {s.profile} at memory slice {s.start}")
    for p, start in target:
        if slot_name(card.index, start) in ledger().slots:
            continue
        manager.create(card.index, p.id, start, origin="layout")
        report.done.append(f"card {card.index}: created {p.name} at memory slice {start}")
