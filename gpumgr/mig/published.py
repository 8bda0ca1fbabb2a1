"""What the agent publishes of its MIG cards in the node inventory annotation (gpumgr/node/mig_inventory.py):
each MIG-enabled card's profiles and placements (from NVML), and the instances the ledger holds (its slots, made
or in flight), so the extender can tell which profiles a node still serves or could still make."""

from __future__ import annotations

from collections.abc import Iterable

from gpumgr.allocator.ledger import Ledger
from gpumgr.mig.types import MigCard
from gpumgr.node.mig_inventory import MigCardView, MigInstanceView, MigProfileView, NodeMig


def node_mig(cards: Iterable[MigCard], ledger: Ledger, prefix: str) -> NodeMig:
    out = []
    for c in cards:
        if not c.enabled:
            continue
        profiles = tuple(MigProfileView(name=p.name, id=p.id, slices=p.slices, memory_slices=p.memory_slices,
                                        max_count=p.max_count, starts=p.starts) for p in c.profiles)
        instances = tuple(MigInstanceView(profile=s.profile, start=s.start, size=s.size, origin=s.origin)
                          for s in sorted(ledger.slots.values(), key=lambda s: s.start) if s.card == c.index)
        out.append(MigCardView(index=c.index, compute_slices=c.compute_slices, memory_slices=c.memory_slices,
                               profiles=profiles, instances=instances))
    return NodeMig(prefix=prefix, cards=tuple(out))
