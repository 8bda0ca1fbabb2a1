"""Putting the kubelet's word into the ledger: allocations whose owner the kubelet checkpoint names differently
from the guess made at Allocate (or that the ledger lost) are replaced in one step.

The keys are released first and then assigned again, so two swapped guesses on a full card repair each other
whatever their order. A truth that cannot be placed is left out and its key keeps exactly what it held before
(nothing held is ever dropped): the change is tried on a copy, and only the set of truths that all fit together
is applied to the ledger. Each left-out truth is reported as a conflict.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.node.claims import is_claim

Conflict = tuple[str, str]  # (key, why)


def apply_truths(ledger: Ledger, truths: list[Allocation], recorded: Collection[str],
                 seen: Mapping[str, Allocation] | None = None) -> list[Conflict]:
    """Replace or add `truths` in `ledger`; `recorded` are the keys the kubelet holds (others may be evicted to make
    room). `seen`: the ledger's allocations when the kubelet's record was read; when given, only those (unchanged)
    may be evicted, never one made since (the kubelet could not have recorded it yet). Returns (key, why) for each
    truth that could not be placed; those keys are left as they were."""
    pending = list(truths)
    conflicts: list[Conflict] = []
    while pending:
        failed = _place(ledger.copy(), pending, recorded, seen)
        if not failed:
            break
        conflicts += failed
        bad = {k for k, _ in failed}
        pending = [a for a in pending if a.key not in bad]
    if pending:
        _place(ledger, pending, recorded, seen)  # the same steps that just succeeded on a copy
    return conflicts


def _place(ledger: Ledger, truths: list[Allocation], recorded: Collection[str],
           seen: Mapping[str, Allocation] | None) -> list[Conflict]:
    for a in truths:
        ledger.release(a.key)
    failed: list[Conflict] = []
    for a in truths:
        try:
            ledger.assign(a, check_health=False)
            continue
        except LedgerError:
            _make_room(ledger, a, recorded, seen)
        try:
            ledger.assign(a, check_health=False)
        except LedgerError as e:
            failed.append((a.key, f"{a.namespace}/{a.pod} container {a.container}: {e}"))
    return failed


def _make_room(ledger: Ledger, want: Allocation, recorded: Collection[str],
               seen: Mapping[str, Allocation] | None) -> None:
    """The kubelet's record wins over allocations it never recorded: free those on the wanted cards."""
    for a in list(ledger.allocations.values()):
        if a.key not in recorded and (seen is None or seen.get(a.key) == a) and not a.verified \
                and not is_claim(a) and set(a.cards) & set(want.cards):
            ledger.release(a.key)
