"""The end state of one path, from the API objects alone: what every card holds (pods' gpumgr annotations and
vcuda limits, claims' allocation results and consumedCapacity), cards over 100 cores or over their memory or
used although unhealthy/cordoned, nodes over their `example.com/gpu`, and for every multi-card placement whether
its worst link is the best the node's usable cards allow (what `gpumgr place` picks on that board)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpumgr.requests import podspec
from gpumgr.requests.quantity import parse_int
from gpumgr.topology.cost import Topology
from tests.bench.scale.fleet import BASELINE_RESOURCE, DRIVER, FakeNode

MIB = 2**20


def audit(nodes: dict[str, FakeNode], pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> Audit:
    out = Audit()
    cores: dict[tuple[str, int], int] = defaultdict(int)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    kinds: dict[tuple[str, int], set[str]] = defaultdict(set)
    shares: dict[tuple[str, int], set[str]] = defaultdict(set)  # "pod share", "claim whole", ... on each card
    placements: list[tuple[str, list[int]]] = []
    for pod in pods:
        node_name = pod["spec"].get("nodeName")
        if not node_name or node_name not in nodes:
            continue
        n = nodes[node_name]
        for c in pod["spec"]["containers"]:
            limits = (c.get("resources") or {}).get("limits") or {}
            whole[node_name] += int(limits.get(BASELINE_RESOURCE, 0))
        ann = pod["metadata"].get("annotations") or {}
        for i, c in enumerate(pod["spec"]["containers"]):
            text = ann.get(f"{podspec.ANN_PREDICATE_IDX}{i}")
            if not text:
                continue
            limits = (c.get("resources") or {}).get("limits") or {}
            core = int(limits.get(podspec.RESOURCE_CORE, 0))
            minors = [int(m) for m in text.split(",") if m]
            cards = [g.index for m in minors for g in n.inventory.gpus if g.minor == m]
            for card in cards:
                kinds[(node_name, card)].add("pod")
                shares[(node_name, card)].add("pod share" if core < 100 else "pod whole")
                mem = n.inventory.gpus[card].memory_mib
                if core < 100:
                    cores[(node_name, card)] += core
                    memory[(node_name, card)] += int(limits.get(podspec.RESOURCE_MEMORY, 0)) * 256
                else:
                    cores[(node_name, card)] += 100
                    memory[(node_name, card)] += mem
            if len(cards) > 1:
                placements.append((node_name, cards))
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        cards = []
        for r in results:
            if r.get("driver") != DRIVER or r.get("pool") not in nodes:
                continue
            n = nodes[r["pool"]]
            card = int(str(r["device"]).removeprefix("gpu-"))
            consumed = r.get("consumedCapacity") or {}
            mem = n.inventory.gpus[card].memory_mib
            cores[(n.name, card)] += parse_int(consumed["cores"]) if "cores" in consumed else 100
            memory[(n.name, card)] += -(-parse_int(consumed["memory"]) // MIB) if "memory" in consumed else mem
            kinds[(n.name, card)].add("claim")
            shares[(n.name, card)].add("claim share" if "cores" in consumed else "claim whole")
            cards.append(card)
        if len(cards) > 1:
            placements.append((results[0]["pool"], cards))
    for (node_name, card), used in cores.items():
        n = nodes[node_name]
        if used > 100 or memory[(node_name, card)] > n.inventory.gpus[card].memory_mib or card not in n.usable:
            held_by = "+".join(sorted(kinds[(node_name, card)]))
            out.overcommitted.append(f"{node_name}/gpu-{card}: {used} cores, {memory[(node_name, card)]} MiB "
                                     f"({held_by})")
            if held_by == "claim+pod":
                out.race_cards[card] += 1
                out.race_kinds[" + ".join(sorted(shares[(node_name, card)]))] += 1
    for node_name, count in whole.items():
        if count > len(nodes[node_name].usable):
            out.overcommitted.append(f"{node_name}: {count} {BASELINE_RESOURCE} of {len(nodes[node_name].usable)}")
    out.cards_used = len(cores) or sum(whole.values())
    for node_name, cards in placements:
        n = nodes[node_name]
        topo = Topology.of(n.inventory)
        best = min(topo.worst(c) for c in itertools.combinations(sorted(n.usable), len(cards)))
        out.multi_card += 1
        out.multi_card_best += topo.worst(cards) <= best
    return out


@dataclass
class Audit:
    overcommitted: list[str] = field(default_factory=list)
    cards_used: int = 0
    multi_card: int = 0
    multi_card_best: int = 0
    # over-committed cards held by pods and claims at once (the two schedulers' race, docs/dra.md), by device index
    # (gpu-0 ...) and by what held them ("claim share + pod whole")
    race_cards: Counter[int] = field(default_factory=Counter)
    race_kinds: Counter[str] = field(default_factory=Counter)

    @property
    def mixed(self) -> int:
        """How many cards the race over-committed."""
        return self.race_cards.total()
