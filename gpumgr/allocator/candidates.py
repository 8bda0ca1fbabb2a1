"""What the evaluators share: which cards are free, and how much taking a card would hurt the rest."""

from __future__ import annotations

from gpumgr.allocator.ledger import Ledger
from gpumgr.topology.cost import Topology
from gpumgr.topology.levels import LevelKey


def free_cards(ledger: Ledger) -> list[int]:
    """Healthy cards nobody holds: the only ones a whole-card request may take."""
    return [c.index for c in ledger.cards if c.healthy and c.mode == "free"]


def isolation(topo: Topology, card: int, free: list[int]) -> tuple[LevelKey, ...]:
    """The card's links to the other free cards, best first. A larger tuple means a more isolated card,
    whose loss breaks fewer good groups."""
    return tuple(sorted(topo.keys[card][o] for o in free if o != card))


def snugness(topo: Topology, cards: list[int], free: list[int]) -> int:
    """Free cards in the smallest tree group holding `cards`: fewer means the choice fits its group snugly
    and leaves larger groups intact."""
    group = set(topo.group_of(cards).gpus)
    return sum(1 for f in free if f in group)


def group_pressure(topo: Topology, card: int, free: list[int]) -> int:
    """Free cards in the smallest tree group that holds `card` and another free card (0 if none): taking a card
    from a small group leaves the larger groups whole."""
    others = [f for f in free if f != card]
    node = topo.tree
    best = 0
    while True:
        inside = [c for c in node.children if card in c.gpus]
        if not inside:
            return best
        node = inside[0]
        if node.level != "GPU" and any(o in node.gpus for o in others):
            best = sum(1 for f in free if f in node.gpus)
