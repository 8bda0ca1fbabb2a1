"""MIG on /metric: one series per instance the ledger holds (card, profile, placement, MIG UUID, who holds it) and
the count per card and profile. Pure: the ledger and inventory in, metric families out."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpumgr.allocator.ledger import Ledger
from gpumgr.devices.types import Inventory


def mig_families(ledger: Ledger, inventory: Inventory) -> Iterator[Metric]:
    if not ledger.slots:
        return
    inst = GaugeMetricFamily("gpumgr_mig_instance", "1 per MIG instance the node holds: its card, profile, first "
                             "memory slice, MIG UUID (empty while being created), origin (layout, claim, adopted) "
                             "and holder (pod or claim; empty when free).",
                             labels=["gpu", "uuid", "profile", "start", "mig_uuid", "origin", "holder"])
    count = GaugeMetricFamily("gpumgr_mig_instances", "MIG instances per card and profile.",
                              labels=["gpu", "uuid", "profile"])
    counts: dict[tuple[int, str], int] = {}
    for s in sorted(ledger.slots.values(), key=lambda s: (s.card, s.start)):
        holders = []
        for key in sorted(ledger.slot_holders.get(s.name, {})):
            a = ledger.allocations.get(key)
            claim = a.claim if a is not None else None
            holders.append(f"claim {claim.namespace}/{claim.name}" if claim is not None
                           else f"pod {a.namespace}/{a.pod}" if a is not None and a.pod else key)
        gpu = inventory.gpus[s.card] if s.card < inventory.count else None
        inst.add_metric([f"gpu{s.card}", gpu.uuid if gpu else "", s.profile, str(s.start), s.uuid, s.origin,
                         ",".join(holders)], 1)
        counts[(s.card, s.profile)] = counts.get((s.card, s.profile), 0) + 1
    for (card, profile), n in sorted(counts.items()):
        gpu = inventory.gpus[card] if card < inventory.count else None
        count.add_metric([f"gpu{card}", gpu.uuid if gpu else "", profile], n)
    yield inst
    yield count


def mig_json(ledger: Ledger) -> list[dict[str, object]]:
    """The instances for /usage (and `gpumgr status`): card, profile, placement, UUID, origin, holders."""
    out: list[dict[str, object]] = []
    for s in sorted(ledger.slots.values(), key=lambda s: (s.card, s.start)):
        holders = sorted(ledger.slot_holders.get(s.name, {}))
        out.append({"name": s.name, "card": s.card, "profile": s.profile, "start": s.start, "size": s.size,
                    "memory_mib": s.memory_mib, "uuid": s.uuid, "origin": s.origin, "holders": holders})
    return out
