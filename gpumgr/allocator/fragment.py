"""fragment: one whole free card, taken where it breaks the fewest good groups.

The card whose links to the other free cards are worst (the most isolated) goes first; ties go to the card with
the fewest free cards on its NUMA node, then the snuggest tree group, then the lowest number (`high_first`: the
highest, see `choose`). Large well-connected free groups (and whole NUMA nodes) stay intact for link requests. This
is the `binpack` and `topology` policy (and the default).

`spread` takes the free card farthest from the cards already in use (its links to the busy cards are the worst),
so pods land on different switches and sockets; ties are broken by the order above. `allowed` (per-pod choices
and the node's cordon, gpumgr/requests/choices.py) narrows the cards it may take; all free cards still count in
the scores.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection

from gpumgr.allocator.candidates import free_cards, group_pressure, isolation
from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.ledger import Ledger
from gpumgr.requests.choices import DEFAULT_POLICY, Policy
from gpumgr.topology.cost import Topology

_RANKED: weakref.WeakKeyDictionary[Topology, dict[tuple[bool, tuple[int, ...]], tuple[int, ...]]] = (
    weakref.WeakKeyDictionary())
MAX_RANKED = 4096  # free-card sets remembered per topology and tie order (2^n for nodes of up to 12 cards)


def rank_free(topo: Topology, free: list[int], high_first: bool = False) -> list[int]:
    """Free cards, best to take first. A pure function of the topology, the set and the tie order: remembered per
    topology."""
    per = _RANKED.get(topo)
    if per is None:
        per = _RANKED.setdefault(topo, {})
    key = (high_first, tuple(free))
    found = per.get(key)
    if found is None:
        if len(per) >= MAX_RANKED:
            per.clear()
        found = per[key] = tuple(_rank_free(topo, free, high_first))
    return list(found)


def rank_every_set(topo: Topology, up_to: int = 8, high_first: bool = False) -> None:
    """Rank every set of free cards now, on a node of at most `up_to` cards (2^8 sets: a few ms): the first pod
    of a new shape then finds them ranked on every node of this hardware."""
    if topo.n <= up_to:
        for bits in range(1 << topo.n):
            rank_free(topo, [c for c in range(topo.n) if bits >> c & 1], high_first)


def _rank_free(topo: Topology, free: list[int], high_first: bool = False) -> list[int]:
    def score(c: int) -> tuple[object, ...]:
        iso = isolation(topo, c, free)
        return (tuple((-a, -b) for a, b in iso), topo.numa_peers(c, free), group_pressure(topo, c, free),
                -c if high_first else c)

    return sorted(free, key=score)


def rank_spread(topo: Topology, ledger: Ledger, free: list[int], high_first: bool = False) -> list[int]:
    """Free cards, farthest from the busy (held) cards first; ties in `rank_free` order."""
    return rank_spread_among(topo, [c.index for c in ledger.cards if c.mode != "free"], free, high_first)


def rank_spread_among(topo: Topology, busy: list[int], free: list[int], high_first: bool = False) -> list[int]:
    """`rank_spread` given the busy cards (held by anyone, healthy or not)."""
    order = {c: r for r, c in enumerate(rank_free(topo, free, high_first))}

    def score(c: int) -> tuple[object, ...]:
        near = isolation(topo, c, busy)  # links to busy cards, best first: larger means farther away
        return (tuple((-a, -b) for a, b in near), order[c])

    return sorted(free, key=score)


def choose_fragment(topo: Topology, ledger: Ledger, allowed: Collection[int] | None = None,
                    policy: Policy = DEFAULT_POLICY, high_first: bool = False) -> tuple[int, ...]:
    free = free_cards(ledger)
    usable = free if allowed is None else [c for c in free if c in allowed]
    if not usable:
        if free:
            raise NoFit(f"needs 1 free whole card; {len(free)} free, none of them allowed")
        unhealthy = sum(1 for c in ledger.cards if not c.healthy)
        busy = len(ledger.cards) - unhealthy
        raise NoFit(f"needs 1 free whole card, none free ({busy} in use, {unhealthy} unhealthy)")
    ranked = rank_spread(topo, ledger, free, high_first) if policy == "spread" else rank_free(topo, free, high_first)
    return (next(c for c in ranked if allowed is None or c in allowed),)
