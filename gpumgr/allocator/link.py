"""link: several whole cards with the best possible worst link.

For each link level from best to worst, the free cards joined at that level or better form a graph; the first
level at which it has a clique of the asked size is the best achievable worst link (exact, as brute force would
find). Among the sets at that level: lowest total pairwise cost, then the fewest NUMA nodes (an all-NVLink board
still hangs its cards off two sockets), then the snuggest tree group and the fullest NUMA nodes (leaving larger
well-connected groups intact), then the lowest card numbers. Small cliques are searched exhaustively, large ones
greedily on cost (the worst link stays optimal either way).

`allowed` (per-pod card choices and the node's cordon, see gpumgr/choices.py) narrows the cards the set may take;
the free cards outside it still count when judging which groups a choice breaks. Every policy takes the same set
here: several whole cards are asked for their links, so the best worst link comes first.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable
from math import comb

import networkx as nx

from gpumgr.allocator.candidates import free_cards, snugness
from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.ledger import Ledger
from gpumgr.topology import Topology

EXHAUSTIVE_LIMIT = 400  # subsets of one clique scored one by one; above this, greedy by cost


def choose_link(topo: Topology, ledger: Ledger, count: int,
                allowed: Collection[int] | None = None) -> tuple[int, ...]:
    free = free_cards(ledger)
    usable = free if allowed is None else [c for c in free if c in allowed]
    if len(usable) < count:
        of = "" if allowed is None else f" of the allowed cards ({len(free)} free on the node)"
        raise NoFit(f"needs {count} free whole cards, {len(usable)} free{of}")
    if count == len(usable):
        return tuple(usable)
    for threshold in topo.distinct_keys():
        g = nx.Graph()
        g.add_nodes_from(usable)
        g.add_edges_from(
            (a, b) for a, b in itertools.combinations(usable, 2) if topo.keys[a][b] <= threshold
        )
        cliques = [sorted(c) for c in nx.find_cliques(g) if len(c) >= count]
        if cliques:
            return _best_in(topo, cliques, count, free)
    raise NoFit(f"needs {count} free whole cards")  # unreachable: the complete graph is a clique


def _best_in(topo: Topology, cliques: list[list[int]], count: int, free: list[int]) -> tuple[int, ...]:
    seen: set[tuple[int, ...]] = set()
    best: tuple[float, int, int, int, tuple[int, ...]] | None = None
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
            score = (round(topo.total_cost(subset), 6), topo.numa_span(subset), snugness(topo, list(subset), free),
                     _numa_room(topo, subset, free), subset)
            if best is None or score < best:
                best = score
    assert best is not None
    return best[-1]


def _numa_room(topo: Topology, cards: tuple[int, ...], free: list[int]) -> int:
    """Free cards on the NUMA nodes the set uses: fewer means it fills a node that is already partly taken."""
    nodes = {topo.numa[c] for c in cards} - {None}
    return sum(1 for f in free if topo.numa[f] in nodes)


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
