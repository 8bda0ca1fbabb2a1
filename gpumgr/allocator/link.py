"""link: several whole cards with the best possible worst link.

For each link level from best to worst, the free cards joined at that level or better form a graph; the first
level at which it has a clique of the asked size is the best achievable worst link (exact, as brute force would
find). Among the sets at that level: lowest total pairwise cost, then the snuggest tree group (leaving larger
well-connected groups intact), then the lowest card numbers. Small cliques are searched exhaustively, large ones
greedily on cost (the worst link stays optimal either way).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from math import comb

import networkx as nx

from gpumgr.allocator.candidates import free_cards, snugness
from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.ledger import Ledger
from gpumgr.topology import Topology

EXHAUSTIVE_LIMIT = 400  # subsets of one clique scored one by one; above this, greedy by cost


def choose_link(topo: Topology, ledger: Ledger, count: int) -> tuple[int, ...]:
    free = free_cards(ledger)
    if len(free) < count:
        raise NoFit(f"needs {count} free whole cards, {len(free)} free")
    if count == len(free):
        return tuple(free)
    for threshold in topo.distinct_keys():
        g = nx.Graph()
        g.add_nodes_from(free)
        g.add_edges_from(
            (a, b) for a, b in itertools.combinations(free, 2) if topo.keys[a][b] <= threshold
        )
        cliques = [sorted(c) for c in nx.find_cliques(g) if len(c) >= count]
        if cliques:
            return _best_in(topo, cliques, count, free)
    raise NoFit(f"needs {count} free whole cards")  # unreachable: the complete graph is a clique


def _best_in(topo: Topology, cliques: list[list[int]], count: int, free: list[int]) -> tuple[int, ...]:
    seen: set[tuple[int, ...]] = set()
    best: tuple[float, int, tuple[int, ...]] | None = None
    for clique in cliques:
        options: Iterable[tuple[int, ...]]
        if comb(len(clique), count) <= EXHAUSTIVE_LIMIT:
            options = itertools.combinations(clique, count)
        else:
            options = _greedy(topo, clique, count)
        for subset in options:
            if subset in seen:
                continue
            seen.add(subset)
            score = (round(topo.total_cost(subset), 6), snugness(topo, list(subset), free), subset)
            if best is None or score < best:
                best = score
    assert best is not None
    return best[2]


def _greedy(topo: Topology, clique: list[int], count: int) -> list[tuple[int, ...]]:
    """From each start card, add the card that adds the least cost; one candidate set per start."""
    out = []
    for start in clique:
        chosen = [start]
        added = {c: topo.costs[start][c] for c in clique if c != start}
        while len(chosen) < count:
            nxt = min(added, key=lambda c: (added[c], c))
            chosen.append(nxt)
            del added[nxt]
            for c in added:
                added[c] += topo.costs[nxt][c]
        out.append(tuple(sorted(chosen)))
    return out
