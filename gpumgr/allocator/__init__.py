"""Choosing cards: the ledger of what is held, and the link / fragment / share evaluators.

`choose` is a pure function of (topology, ledger, request[, allowed cards, policy]): it never changes the ledger.
The allowed cards and the policy come from the pod's annotations and the node's cordon (gpumgr/requests/choices.py);
without them the choice is the default one.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.fragment import choose_fragment
from gpumgr.allocator.ledger import (
    Allocation,
    CardState,
    ClaimHolder,
    ContainerHolder,
    Holder,
    Holding,
    Ledger,
    LedgerError,
)
from gpumgr.allocator.link import choose_link
from gpumgr.allocator.request import HUNDRED, InvalidRequest, Request
from gpumgr.allocator.share import choose_share
from gpumgr.requests.choices import DEFAULT_POLICY, POLICIES, Policy
from gpumgr.topology.cost import Topology

__all__ = [
    "DEFAULT_POLICY", "HUNDRED", "Allocation", "CardState", "ClaimHolder", "ContainerHolder", "Holder", "Holding",
    "InvalidRequest", "Ledger", "LedgerError", "NoFit", "Placement", "Policy", "Request", "choose",
]


def choose(topo: Topology, ledger: Ledger, req: Request, allowed: Collection[int] | None = None,
           policy: Policy = DEFAULT_POLICY, high_first: bool = False) -> Placement:
    """Cards for `req` on this node, only among `allowed` (None: any card), ordered by `policy`.
    Raises InvalidRequest (never satisfiable) or NoFit (not now, or not on the allowed cards).

    `high_first`: among cards (or sets) equally good by every measure of the evaluators, the highest card numbers
    instead of the lowest. The placement is as good either way (same fit, same links); the extender asks for it
    when it counts DRA claims (`both` mode), because kube-scheduler's DRA allocator tries a node's devices in
    slice order (`gpu-0` first) and takes the first that fits: the two then take cards from opposite ends."""
    if topo.n != len(ledger):
        raise ValueError(f"topology has {topo.n} cards, ledger {len(ledger)}")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    req.validate(len(ledger), ledger.largest_card_mib())
    if allowed is not None:
        allowed = frozenset(allowed)
        if not allowed:
            raise NoFit("no card of this node may be used (per-pod card choices or cordon)")
    kind = req.evaluator
    if kind == "link":
        cards = choose_link(topo, ledger, req.cards_needed, allowed, high_first)
    elif kind == "fragment":
        cards = choose_fragment(topo, ledger, allowed, policy, high_first)
    else:
        cards = choose_share(topo, ledger, req, allowed, policy, high_first)
    return Placement(cards=cards, evaluator=kind)


@dataclass(frozen=True)
class Placement:
    cards: tuple[int, ...]
    evaluator: str  # link | fragment | share
