"""fragment: one whole free card, taken where it breaks the fewest good groups.

The card whose links to the other free cards are worst (the most isolated) goes first; ties go to the snuggest
tree group, then the lowest number. Large well-connected free groups stay intact for link requests.
"""

from __future__ import annotations

from gpumgr.allocator.candidates import free_cards, group_pressure, isolation
from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.ledger import Ledger
from gpumgr.topology import Topology


def rank_free(topo: Topology, free: list[int]) -> list[int]:
    """Free cards, best to take first."""

    def score(c: int) -> tuple[object, ...]:
        iso = isolation(topo, c, free)
        return (tuple((-a, -b) for a, b in iso), group_pressure(topo, c, free), c)

    return sorted(free, key=score)


def choose_fragment(topo: Topology, ledger: Ledger) -> tuple[int, ...]:
    free = free_cards(ledger)
    if not free:
        unhealthy = sum(1 for c in ledger.cards if not c.healthy)
        busy = len(ledger.cards) - unhealthy
        raise NoFit(f"needs 1 free whole card, none free ({busy} in use, {unhealthy} unhealthy)")
    return (rank_free(topo, free)[0],)
