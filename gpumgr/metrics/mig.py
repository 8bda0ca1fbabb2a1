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
    share_mem = GaugeMetricFamily("gpumgr_mig_share_memory_bytes", "Memory of each share inside a MIG instance "
                                  "(enforced by the vCUDA shim), by holder.",
                                  labels=["gpu", "profile", "mig_uuid", "holder"])
    share_cores = GaugeMetricFamily("gpumgr_mig_share_cores", "Cores (percent of the instance) of each share inside "
                                    "a MIG instance, by holder.", labels=["gpu", "profile", "mig_uuid", "holder"])
    counts: dict[tuple[int, str], int] = {}
    for s in sorted(ledger.slots.values(), key=lambda s: (s.card, s.start)):
        holders = []
        for key in sorted(ledger.slot_holders.get(s.name, {})):
            name = holder_name(ledger, key)
            holders.append(name)
            h = ledger.slot_holders[s.name][key]
            if h.cores < 100:
                share_mem.add_metric([f"gpu{s.card}", s.profile, s.uuid, name], h.memory_mib << 20)
                share_cores.add_metric([f"gpu{s.card}", s.profile, s.uuid, name], h.cores)
        gpu = inventory.gpus[s.card] if s.card < inventory.count else None
        inst.add_metric([f"gpu{s.card}", gpu.uuid if gpu else "", s.profile, str(s.start), s.uuid, s.origin,
                         ",".join(holders)], 1)
        counts[(s.card, s.profile)] = counts.get((s.card, s.profile), 0) + 1
    for (card, profile), n in sorted(counts.items()):
        gpu = inventory.gpus[card] if card < inventory.count else None
        count.add_metric([f"gpu{card}", gpu.uuid if gpu else "", profile], n)
    yield inst
    yield count
    yield share_mem
    yield share_cores


def holder_name(ledger: Ledger, key: str) -> str:
    """`claim <ns>/<name>`, `pod <ns>/<name>` when known, else the ledger key."""
    a = ledger.allocations.get(key)
    claim = a.claim if a is not None else None
    return (f"claim {claim.namespace}/{claim.name}" if claim is not None
            else f"pod {a.namespace}/{a.pod}" if a is not None and a.pod else key)


def mig_json(ledger: Ledger) -> list[dict[str, object]]:
    """The instances for /usage (and `gpumgr status`): card, profile, placement, UUID, origin, holders (ledger
    keys) and `held_by`: per holder its name (pod or claim when known) and what it takes (cores 100: whole; fewer:
    a share inside the instance)."""
    out: list[dict[str, object]] = []
    for s in sorted(ledger.slots.values(), key=lambda s: (s.card, s.start)):
        held = ledger.slot_holders.get(s.name, {})
        held_by = [{"key": k, "holder": holder_name(ledger, k), "cores": h.cores, "memory_mib": h.memory_mib}
                   for k, h in sorted(held.items())]
        out.append({"name": s.name, "card": s.card, "profile": s.profile, "start": s.start, "size": s.size,
                    "memory_mib": s.memory_mib, "uuid": s.uuid, "origin": s.origin, "holders": sorted(held),
                    "held_by": held_by})
    return out
