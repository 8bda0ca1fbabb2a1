"""share: a fraction of exactly one card, best fit.

Only healthy cards not held whole, with enough free cores and memory. Cards already shared come before free
ones (whole cards stay available), then the tightest fit in cores, then in memory; among free cards, the most
isolated first (as fragment would take them), then the lowest number (`high_first`: the highest). That is the
`binpack` policy (and the default).

`topology`: shared cards first too, but a free card is broken in fragment's order (the most isolated first)
before fit is looked at, so on a node of mixed cards a share never breaks a well-linked free group to fit
tighter. `spread`: the emptiest card first (most free cores, then most free memory), free cards included, then
the free card farthest from the cards in use (as fragment's `spread` takes them). `allowed`
(gpumgr/requests/choices.py) narrows the cards it may take.
"""

from __future__ import annotations

from collections.abc import Collection

from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.fragment import rank_free, rank_spread
from gpumgr.allocator.ledger import CardState, Ledger
from gpumgr.allocator.request import Request
from gpumgr.requests.choices import DEFAULT_POLICY, Policy
from gpumgr.topology.cost import Topology


def choose_share(topo: Topology, ledger: Ledger, req: Request, allowed: Collection[int] | None = None,
                 policy: Policy = DEFAULT_POLICY, high_first: bool = False) -> tuple[int, ...]:
    fitting = [
        c for c in ledger.cards
        if c.healthy and c.mode != "exclusive"
        and c.free_cores >= req.cores and c.free_memory_mib >= req.memory_mib
    ]
    fits = fitting if allowed is None else [c for c in fitting if c.index in allowed]
    if not fits:
        if fitting:
            raise NoFit(f"needs {req.cores} cores and {req.memory_mib} MiB on one card; {len(fitting)} card(s) "
                        "have room, none of them allowed")
        raise NoFit(_shortfall(ledger, req))
    # ranked among every free card that could take the share, allowed or not: the groups it breaks are the node's
    free = [c.index for c in fitting if c.mode == "free"]
    ranked = rank_spread(topo, ledger, free, high_first) if policy == "spread" else rank_free(topo, free, high_first)
    free_order = {c: r for r, c in enumerate(ranked)}
    sign = -1 if high_first else 1

    def key(c: CardState) -> tuple[object, ...]:
        rank = free_order.get(c.index, 0)
        last = sign * c.index
        if policy == "spread":
            return (-c.free_cores, -c.free_memory_mib, rank, last)
        if policy == "topology":
            return (c.mode == "free", rank, c.free_cores - req.cores, c.free_memory_mib - req.memory_mib, last)
        return (c.mode == "free", c.free_cores - req.cores, c.free_memory_mib - req.memory_mib, rank, last)

    return (min(fits, key=key).index,)


def _shortfall(ledger: Ledger, req: Request) -> str:
    usable = [c for c in ledger.cards if c.healthy and c.mode != "exclusive"]
    if not usable:
        healthy = sum(1 for c in ledger.cards if c.healthy)
        want = f"needs {req.cores} cores and {req.memory_mib} MiB on one card"
        if not healthy:
            return f"{want}: no card is healthy"
        whole = f"all {healthy} healthy cards are held whole" if healthy > 1 else "the healthy card is held whole"
        sick = len(ledger) - healthy
        return f"{want}: {whole} by whole-card pods" + (f" ({sick} unhealthy)" if sick else "")
    most_cores = max(c.free_cores for c in usable)
    most_mem = max(c.free_memory_mib for c in usable)
    return (
        f"needs {req.cores} cores and {req.memory_mib} MiB on one card; the best cards have {most_cores} free "
        f"cores and {most_mem} MiB free"
    )
