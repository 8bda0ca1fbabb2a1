"""Putting the kubelet's word into the ledger: allocations whose owner the kubelet checkpoint names differently
from the guess made at Allocate (or that the ledger lost) are replaced in one step.

All the keys are released first and then assigned again, so two swapped guesses on a full card repair each other
whatever their order; an allocation that still cannot be placed gets its previous form back (nothing held is
ever dropped) and is reported as a conflict.
"""

from __future__ import annotations

from collections.abc import Collection

from gpumgr.allocator import Allocation, Ledger, LedgerError


def apply_truths(ledger: Ledger, truths: list[Allocation], recorded: Collection[str]) -> list[str]:
    """Replace or add `truths` in `ledger`; `recorded` are the keys the kubelet holds (others may be evicted to make
    room). Returns one line per allocation that could not be placed."""
    originals = {a.key: ledger.held_by(a.key) for a in truths}
    for a in truths:
        ledger.release(a.key)
    conflicts = []
    for a in truths:
        try:
            ledger.assign(a, check_health=False)
            continue
        except LedgerError:
            _make_room(ledger, a, recorded)
        try:
            ledger.assign(a, check_health=False)
        except LedgerError as e:
            conflicts.append(f"{a.meta.get('namespace')}/{a.meta.get('pod')} container {a.meta.get('container')}: {e}")
            old = originals.get(a.key)
            if old is not None and ledger.problem(old, check_health=False) is None:
                ledger.assign(old, check_health=False)
    return conflicts


def _make_room(ledger: Ledger, want: Allocation, recorded: Collection[str]) -> None:
    """The kubelet's record wins over allocations it never recorded: free those on the wanted cards."""
    for a in list(ledger.allocations.values()):
        if a.key not in recorded and a.meta.get("verified") != "true" and not a.key.startswith("dra/") \
                and set(a.cards) & set(want.cards):
            ledger.release(a.key)
