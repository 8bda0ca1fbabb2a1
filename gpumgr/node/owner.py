"""The allocation of a named owner: one builder for every path that names a container as the holder of cards
(Allocate's guess, PreStartContainer's verification, reconcile's restore, settling a guess the kubelet names)."""

from __future__ import annotations

import time

from gpumgr.allocator import Allocation, ContainerHolder
from gpumgr.allocator.ledger import BOUNDS, in_bounds
from gpumgr.node import binding


def allocation_for(cand: binding.Candidate, cards: tuple[int, ...], key: str, memory_unit_mib: int,
                   verified: bool = False, ids: list[str] | None = None) -> Allocation:
    """The allocation `cand` holds on `cards` under `key`. A pod spec's vcuda-memory beyond what the ledger can
    record (podspec allows up to 2^63-1) is kept as not known: the holder is still named, and a share asking it
    asks the most the ledger records, which no card has (`Ledger.problem` refuses it), so nothing is ever written
    to a checkpoint the next start would refuse."""
    ask = cand.ask
    units = ask.memory_units if in_bounds("memory_units", ask.memory_units) else None
    memory = 0 if ask.cores >= 100 else min(max(0, ask.memory_units) * memory_unit_mib, BOUNDS["memory_mib"][1] - 1)
    holder = ContainerHolder(pod_uid=cand.uid, namespace=cand.namespace, pod=cand.name, container=ask.name,
                             container_index=ask.index, init=ask.init, memory_units=units)
    return Allocation(key=key, cards=tuple(cards), cores=ask.cores, memory_mib=memory, holder=holder,
                      verified=verified, created=int(time.time()),
                      # the kubelet may hand an init container's devices on to the pod's app containers
                      ids=tuple(sorted(ids)) if ask.init and ids else ())
