"""Choosing cards: the ledger of what is held, and the link / fragment / share evaluators.

`choose` is a pure function of (topology, ledger, request): it never changes the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.fragment import choose_fragment
from gpumgr.allocator.ledger import Allocation, CardState, Holding, Ledger, LedgerError
from gpumgr.allocator.link import choose_link
from gpumgr.allocator.request import HUNDRED, InvalidRequest, Request
from gpumgr.allocator.share import choose_share
from gpumgr.topology import Topology

__all__ = [
    "HUNDRED", "Allocation", "CardState", "Holding", "InvalidRequest", "Ledger", "LedgerError", "NoFit",
    "Placement", "Request", "choose",
]


def choose(topo: Topology, ledger: Ledger, req: Request) -> Placement:
    """Cards for `req` on this node. Raises InvalidRequest (never satisfiable) or NoFit (not now)."""
    if topo.n != len(ledger):
        raise ValueError(f"topology has {topo.n} cards, ledger {len(ledger)}")
    req.validate(len(ledger), ledger.largest_card_mib())
    kind = req.evaluator
    if kind == "link":
        cards = choose_link(topo, ledger, req.cards_needed)
    elif kind == "fragment":
        cards = choose_fragment(topo, ledger)
    else:
        cards = choose_share(topo, ledger, req)
    return Placement(cards=cards, evaluator=kind)


@dataclass(frozen=True)
class Placement:
    cards: tuple[int, ...]
    evaluator: str  # link | fragment | share
