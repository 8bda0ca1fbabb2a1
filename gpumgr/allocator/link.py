"""link: several whole cards with the best possible worst link.

For each link level from best to worst, the free cards joined at that level or better form a graph; the first
level at which it has a clique of the asked size is the best achievable worst link (exact, as brute force would
find). Among the sets at that level: lowest total pairwise cost, then the fewest NUMA nodes (an all-NVLink board
still hangs its cards off two sockets), then the snuggest tree group and the fullest NUMA nodes (leaving larger
well-connected groups intact), then the lowest card numbers (`high_first`: the highest, see `choose`). Small
cliques are searched exhaustively, large ones greedily on cost (the worst link stays optimal either way). On a node
with few cards, where every clique is searched exhaustively, the sets are enumerated directly instead (`_small`):
the same sets, scored the same way.

`allowed` (per-pod card choices and the node's cordon, see gpumgr/requests/choices.py) narrows the cards the set may
take; the free cards outside it still count when judging which groups a choice breaks. Every policy takes the same set
here: several whole cards are asked for their links, so the best worst link comes first.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from math import comb

from gpumgr.allocator.candidates import free_cards, snugness
from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.ledger import Ledger
from gpumgr.topology.cost import Topology
from gpumgr.topology.levels import LevelKey

EXHAUSTIVE_LIMIT = 400  # subsets of one clique scored one by one; above this, greedy by cost


def choose_link(topo: Topology, ledger: Ledger, count: int,
                allowed: Collection[int] | None = None, high_first: bool = False) -> tuple[int, ...]:
    free = free_cards(ledger)
    usable = free if allowed is None else [c for c in free if c in allowed]
    if len(usable) < count:
        of = "" if allowed is None else f" of the allowed cards ({len(free)} free on the node)"
        raise NoFit(f"needs {count} free whole cards, {len(usable)} free{of}")
    return link_among(topo, usable, free, count, high_first)


def link_among(topo: Topology, usable: list[int], free: list[int], count: int,
               high_first: bool = False) -> tuple[int, ...]:
    """The set `choose_link` takes from `usable` (at least `count` cards; `free`: all free cards of the node)."""
    if count == len(usable):
        return tuple(usable)
    if comb(topo.n, count) <= EXHAUSTIVE_LIMIT:
        return _small(topo, usable, free, count, high_first)
    import networkx as nx  # on demand: only nodes of many cards get here (and the node agent may never)

    for threshold in topo.distinct_keys():
        g = nx.Graph()
        g.add_nodes_from(usable)
        g.add_edges_from(
            (a, b) for a, b in itertools.combinations(usable, 2) if topo.keys[a][b] <= threshold
        )
        cliques = [sorted(c) for c in nx.find_cliques(g) if len(c) >= count]
        if cliques:
            return _best_in(topo, cliques, count, free, high_first)
    raise NoFit(f"needs {count} free whole cards")  # unreachable: the complete graph is a clique


def _small(topo: Topology, usable: list[int], free: list[int], count: int, high_first: bool) -> tuple[int, ...]:
    """Without a graph, when every clique is searched exhaustively anyway: the subsets scored there are exactly the
    subsets of `usable` whose worst link is the best achievable one (each lies in some maximal clique)."""
    mask = sum(1 << c for c in usable)
    free_bits = sum(1 << c for c in free)
    found = None
    best: tuple[float, int, int, int, tuple[int, ...], tuple[int, ...]] | None = None
    for s in _subsets(topo, count):
        if found is not None and s.worst != found:
            break
        if s.bits & mask == s.bits:
            found = s.worst
            # `_best_in`'s score: snugness and NUMA room are the free cards in the set's group and NUMA nodes
            score = (s.cost, s.numa_span, (s.group & free_bits).bit_count(), (s.numa & free_bits).bit_count(),
                     s.descending if high_first else s.cards, s.cards)
            if best is None or score < best:
                best = score
    assert best is not None
    return best[-1]


@dataclass(frozen=True, slots=True)
class Subset:
    """A set of cards with what `_best_in` scores of it that does not depend on which cards are free."""

    worst: LevelKey
    bits: int
    cards: tuple[int, ...]
    descending: tuple[int, ...]  # the cards negated: the lexicographically last set sorts first (`high_first`)
    cost: float  # total pairwise cost, rounded as `_best_in` rounds it
    numa_span: int
    group: int  # the cards of the smallest tree group holding the set, as bits
    numa: int  # the cards on the set's (known) NUMA nodes, as bits


_SUBSETS: weakref.WeakKeyDictionary[Topology, dict[int, list[Subset]]] = weakref.WeakKeyDictionary()


def _subsets(topo: Topology, count: int) -> list[Subset]:
    """Every `count`-subset of the node's cards, best worst link first (a few hundred at most: see `_small`)."""
    per = _SUBSETS.setdefault(topo, {})
    found = per.get(count)
    if found is None:
        found = []
        for s in itertools.combinations(range(topo.n), count):
            nodes = {topo.numa[c] for c in s} - {None}
            found.append(Subset(worst=topo.worst(s), bits=_bits(s), cards=s, descending=tuple(-c for c in s),
                                cost=round(topo.total_cost(s), 6), numa_span=topo.numa_span(s),
                                group=_bits(topo.group_of(s).gpus),
                                numa=_bits(c for c in range(topo.n) if topo.numa[c] in nodes)))
        found.sort(key=lambda x: (x.worst, x.bits))
        per[count] = found
    return found


def _bits(cards: Iterable[int]) -> int:
    return sum(1 << c for c in cards)


def _best_in(topo: Topology, cliques: list[list[int]], count: int, free: list[int],
             high_first: bool = False) -> tuple[int, ...]:
    seen: set[tuple[int, ...]] = set()
    best: tuple[float, int, int, int, tuple[int, ...], tuple[int, ...]] | None = None
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
                     _numa_room(topo, subset, free), tuple(-c for c in subset) if high_first else subset, subset)
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
