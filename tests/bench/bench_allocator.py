"""Allocator decisions: latency on 8- and 16-GPU nodes, quality against brute force and against first fit."""

from __future__ import annotations

import itertools
import random
import time

from gpumgr.allocator import Allocation, Ledger, NoFit, Request, choose
from gpumgr.devices.topo_text import parse_topo_text
from gpumgr.topology.cost import Topology
from tests.bench.stats import Progress, summary_ms
from tests.helpers import TOPO_FILES, topo_path

MEM = 16384


def sixteen_pcie() -> Topology:
    """2 sockets x 2 host bridges x 2 PCIe switches x 2 GPUs, NVLink pairs on each switch."""
    n = 16
    levels = [["X"] * n for _ in range(n)]
    for a, b in itertools.combinations(range(n), 2):
        if a // 2 == b // 2:
            lvl = "NV2"
        elif a // 4 == b // 4:
            lvl = "PXB"
        elif a // 8 == b // 8:
            lvl = "NODE"
        else:
            lvl = "SYS"
        levels[a][b] = levels[b][a] = lvl
    return Topology(levels)


def sixteen_nvswitch() -> Topology:
    return Topology([["X" if i == j else "NV12" for j in range(16)] for i in range(16)])


def random_request(rng: random.Random, n: int) -> Request:
    r = rng.random()
    if r < 0.55:
        return Request(rng.choice([10, 20, 25, 30, 50, 70]), rng.choice([4, 8, 16, 24]) * 256)
    if r < 0.8:
        return Request(100)
    return Request(100 * rng.randint(2, max(2, n // 2)))


def latency(topo: Topology, label: str, decisions: int = 3000) -> None:
    rng = random.Random(1)
    ledger = Ledger([MEM] * topo.n)
    live: list[str] = []
    samples: list[float] = []
    for i in range(decisions):
        if live and (rng.random() < 0.45 or len(live) > 3 * topo.n):
            ledger.release(live.pop(rng.randrange(len(live))))
        req = random_request(rng, topo.n)
        t0 = time.perf_counter()
        try:
            placed = choose(topo, ledger, req)
            ledger.assign(Allocation(f"p{i}", placed.cards, req.cores, req.memory_mib))
            live.append(f"p{i}")
        except NoFit:
            pass
        samples.append(time.perf_counter() - t0)
    rate = len(samples) / sum(samples)
    print(f"  {label:34s} {rate:9.0f} decisions/s; {summary_ms(samples)}")


def link_quality() -> None:
    worse = 0
    cost_gap: list[float] = []
    checked = 0
    progress = Progress("link vs brute force, topologies", total=len(TOPO_FILES))
    for path in TOPO_FILES:
        progress.tick()
        topo = Topology(parse_topo_text(path.read_text()).levels)
        ledger = Ledger([MEM] * topo.n)
        for k in range(2, topo.n + 1):
            got = choose(topo, ledger, Request(100 * k)).cards
            combos = list(itertools.combinations(range(topo.n), k))
            best = min(topo.worst(c) for c in combos)
            cheapest = min(topo.total_cost(c) for c in combos if topo.worst(c) == best)
            worse += topo.worst(got) > best
            cost_gap.append(topo.total_cost(got) / cheapest if cheapest else 1.0)
            checked += 1
    print(f"  link vs brute force on {len(TOPO_FILES)} real topologies, {checked} (node, size) cases: "
          f"worse worst-link {worse}; total cost ratio mean {sum(cost_gap) / len(cost_gap):.4f}, "
          f"max {max(cost_gap):.4f}")


def first_fit_share(ledger: Ledger, req: Request) -> tuple[int, ...]:
    for c in ledger.cards:
        if c.healthy and c.mode != "exclusive" and c.free_cores >= req.cores and c.free_memory_mib >= req.memory_mib:
            return (c.index,)
    raise NoFit("no card")


def first_fit_whole(ledger: Ledger, k: int) -> tuple[int, ...]:
    free = [c.index for c in ledger.cards if c.healthy and c.mode == "free"]
    if len(free) < k:
        raise NoFit("no cards")
    return tuple(free[:k])


def admitted_before_refusal(topo: Topology, seed: int, smart: bool) -> tuple[int, list[float]]:
    rng = random.Random(seed)
    ledger = Ledger([MEM] * topo.n)
    live: list[str] = []
    worst_links: list[float] = []
    for i in range(10_000):
        if live and rng.random() < 0.25:
            ledger.release(live.pop(rng.randrange(len(live))))
        req = random_request(rng, topo.n)
        try:
            if smart:
                cards = choose(topo, ledger, req).cards
            elif req.whole:
                cards = first_fit_whole(ledger, req.cards_needed)
            else:
                cards = first_fit_share(ledger, req)
        except NoFit:
            return i, worst_links
        if len(cards) > 1:
            worst_links.append(topo.costs[0][0] + max(topo.costs[a][b] for a, b in itertools.combinations(cards, 2)))
        ledger.assign(Allocation(f"p{i}", cards, req.cores, req.memory_mib))
        live.append(f"p{i}")
    return 10_000, worst_links


def packing() -> None:
    def real(prefix: str) -> Topology:
        return Topology(parse_topo_text(topo_path(prefix).read_text()).levels)

    for label, topo in (("p40 7-GPU PCIe", real("p40")), ("baobab 8-GPU NVLink pairs", real("baobab")),
                        ("dgx1 hybrid cube mesh", real("dgx1")), ("16-GPU PCIe+NVLink pairs", sixteen_pcie())):
        ours, base, ours_w, base_w = [], [], [], []
        progress = Progress(f"packing {label}, seeds", total=40)
        for seed in range(40):
            progress.tick()
            n, w = admitted_before_refusal(topo, seed, True)
            ours.append(n)
            ours_w += w
            n, w = admitted_before_refusal(topo, seed, False)
            base.append(n)
            base_w += w
        mo, mb = sum(ours) / len(ours), sum(base) / len(base)
        wo = sum(ours_w) / max(1, len(ours_w))
        wb = sum(base_w) / max(1, len(base_w))
        print(f"  {label:28s} pods before first refusal: gpumgr {mo:6.1f} vs first-fit {mb:6.1f} "
              f"(x{mo / mb:.2f}); mean worst-link cost of multi-card pods {wo:5.1f} vs {wb:5.1f} "
              f"(lower is better; NV# < 10 <= PIX, SYS = 50)")


def fractional_admitted(topo: Topology, seed: int, smart: bool) -> int:
    """Fractional pods only (random cores and memory, some leaving): how many are admitted before one is refused."""
    rng = random.Random(seed)
    ledger = Ledger([MEM] * topo.n)
    live: list[str] = []
    for i in range(100_000):
        if live and rng.random() < 0.2:
            ledger.release(live.pop(rng.randrange(len(live))))
        cores = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 60, 70, 80])
        req = Request(cores, rng.choice([1, 2, 4, 8, 12, 24, 32]) * 256)
        try:
            cards = choose(topo, ledger, req).cards if smart else first_fit_share(ledger, req)
        except NoFit:
            return i
        ledger.assign(Allocation(f"p{i}", cards, req.cores, req.memory_mib))
        live.append(f"p{i}")
    return 100_000


def fractional() -> None:
    topo = Topology(parse_topo_text(topo_path("dgx-a100").read_text()).levels)
    progress = Progress("fractional, runs", total=400)
    ours, base = [], []
    for s in range(200):
        ours.append(fractional_admitted(topo, s, True))
        base.append(fractional_admitted(topo, s, False))
        progress.tick(2)
    mo, mb = sum(ours) / len(ours), sum(base) / len(base)
    print(f"  fractional pods admitted before the first refusal (8 cards, 200 seeds): best fit {mo:.1f} vs "
          f"first fit {mb:.1f} (x{mo / mb:.2f})")


def numa_spread() -> None:
    """All-NVLink boards whose cards hang off two or four NUMA nodes: how often a multi-card pod crosses more
    NUMA nodes than it has to, with the NUMA tie-break and without it (same random workload)."""
    from gpumgr.devices.spec import inventory_from_topo_file

    for prefix in ("princeton-della-pli", "dgx-a100"):
        inv = inventory_from_topo_file(topo_path(prefix), memory_mib=MEM)
        numa = [g.numa_node for g in inv.gpus]
        per_node = max(numa.count(n) for n in set(numa))
        figures = []
        for topo in (Topology(inv.levels, numa=numa), Topology(inv.levels)):
            rng = random.Random(7)
            ledger = Ledger([MEM] * topo.n)
            live: list[str] = []
            multi = avoidable = 0
            for i in range(4000):
                if live and rng.random() < 0.4:
                    ledger.release(live.pop(rng.randrange(len(live))))
                req = Request(100 * rng.choice([1, 1, 2, 2, 4]))
                try:
                    cards = choose(topo, ledger, req).cards
                except NoFit:
                    continue
                if len(cards) > 1:
                    multi += 1
                    free = [c.index for c in ledger.cards if c.mode == "free"]
                    need = min(len({numa[c] for c in combo}) for combo in itertools.combinations(free, len(cards)))
                    spans = len({numa[c] for c in cards})
                    avoidable += spans > need and len(cards) <= per_node
                ledger.assign(Allocation(f"p{i}", cards, req.cores, req.memory_mib))
                live.append(f"p{i}")
            figures.append(100 * avoidable / max(1, multi))
        print(f"  {prefix:28s} multi-card pods on more NUMA nodes than needed: {figures[0]:.1f} % with the NUMA "
              f"tie-break vs {figures[1]:.1f} % without")


def main() -> None:
    print("Decision latency (choose + assign, mixed requests, ~half the node busy):")
    p40 = Topology(parse_topo_text(topo_path("p40").read_text()).levels)
    dgx1 = Topology(parse_topo_text(topo_path("dgx1").read_text()).levels)
    a100 = Topology(parse_topo_text(topo_path("dgx-a100").read_text()).levels)
    latency(p40, "7 GPUs, PCIe tree (p40)")
    latency(dgx1, "8 GPUs, hybrid cube mesh (dgx1)")
    latency(a100, "8 GPUs, NV12 all-to-all (dgx-a100)")
    latency(sixteen_pcie(), "16 GPUs, PCIe + NVLink pairs")
    latency(sixteen_nvswitch(), "16 GPUs, NVSwitch all-to-all")
    print("Placement quality:")
    link_quality()
    packing()
    fractional()
    numa_spread()


if __name__ == "__main__":
    main()
