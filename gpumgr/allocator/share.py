"""share: a fraction of exactly one card, best fit.

Only healthy cards not held whole, with enough free cores and memory. Cards already shared come before free
ones (whole cards stay available), then the tightest fit in cores, then in memory; among free cards, the most
isolated first (as fragment would take them), then the lowest number.
"""

from __future__ import annotations

from gpumgr.allocator.errors import NoFit
from gpumgr.allocator.fragment import rank_free
from gpumgr.allocator.ledger import Ledger
from gpumgr.allocator.request import Request
from gpumgr.topology import Topology


def choose_share(topo: Topology, ledger: Ledger, req: Request) -> tuple[int, ...]:
    fits = [
        c for c in ledger.cards
        if c.healthy and c.mode != "exclusive"
        and c.free_cores >= req.cores and c.free_memory_mib >= req.memory_mib
    ]
    if not fits:
        raise NoFit(_shortfall(ledger, req))
    free_order = {c: r for r, c in enumerate(rank_free(topo, [c.index for c in fits if c.mode == "free"]))}
    best = min(
        fits,
        key=lambda c: (
            c.mode == "free",
            c.free_cores - req.cores,
            c.free_memory_mib - req.memory_mib,
            free_order.get(c.index, 0),
            c.index,
        ),
    )
    return (best.index,)


def _shortfall(ledger: Ledger, req: Request) -> str:
    usable = [c for c in ledger.cards if c.healthy and c.mode != "exclusive"]
    if not usable:
        return f"needs {req.cores} cores and {req.memory_mib} MiB on one card: no healthy card is shareable"
    most_cores = max(c.free_cores for c in usable)
    most_mem = max(c.free_memory_mib for c in usable)
    return (
        f"needs {req.cores} cores and {req.memory_mib} MiB on one card; the best cards have {most_cores} free "
        f"cores and {most_mem} MiB free"
    )
