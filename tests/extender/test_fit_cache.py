"""The cluster view's shortcuts (card rows kept per node, nodes in the same state answered once, whole-card sets
chosen without a graph, free-card rankings remembered) give exactly the answers of placing from the ledger.

Seeded random clusters of varied hardware (mixed models and memory, unhealthy cards, cordons) and holdings, and
varied pods (shares, whole cards, several containers, model filters, policies, card choices): every verdict and
placement of the view must equal the plain computation (`place` and `with_packing` on the node's ledger), packing
included, to the last bit; and after pods come and go, the view must answer for the new state. Both tie orders
(`ClusterView(high_first=...)`, the extender counting DRA claims): the plain computation breaks ties as the view
does.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any

import networkx as nx
import pytest

from gpumgr.allocator import link
from gpumgr.allocator.fragment import _rank_free, rank_free
from gpumgr.devices.types import Inventory
from gpumgr.extender.ask import PodAsk, pod_ask
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.fit import Fit, place, static_check, with_packing
from gpumgr.extender.score import scores
from gpumgr.node import inventory as node_inventory
from gpumgr.requests.choices import ANN_CORDON, ANN_POLICY, ANN_UUID_EXCLUDE, ANN_UUID_SELECT, allowed_cards
from gpumgr.topology.cost import Topology
from tests.extender.support import A100, T4, holding, pod, topo_inventory

FIXTURES = ["dgx-a100-8x_epyc7742_10nic_numa3175_tabs.txt", "dgx1-like_8x-v100-sxm2_hybrid-cube-mesh_mlx5.txt",
            "baobab-gpu048_8x-rtxa6000_nvlink-pairs_2socket_2nic.txt", "h100-8x_hgx_12nic_numa-off_tabs.txt",
            "a30-4x_nvlink-bridge-pairs_2socket_1nic.txt", "t4-4x_pcie_2socket_1-3-split_sys-node.txt",
            "p40-7x_pix-phb_mlx4_seed-gpu-manager-notes.txt"]
UNIT = 256


def hardware(rng: random.Random, k: int) -> tuple[Inventory, list[int]]:
    """A node's inventory (sometimes mixed models and memory sizes) and its unhealthy cards."""
    inv = topo_inventory(FIXTURES[k % len(FIXTURES)], memory_mib=16384)
    if k % 3 == 1:
        gpus = tuple(replace(g, name=T4 if g.index % 3 == 2 else A100, memory_mib=8192 if g.index % 2 else 16384,
                             uuid=f"GPU-{k:04d}-{g.index}") for g in inv.gpus)
    else:
        gpus = tuple(replace(g, uuid=f"GPU-{k:04d}-{g.index}") for g in inv.gpus)
    inv = Inventory(gpus=gpus, levels=inv.levels)
    sick = [i for i in range(len(gpus)) if rng.random() < 0.06]
    return inv, sick


def holdings(rng: random.Random, name: str, inv: Inventory, tag: str) -> list[dict[str, Any]]:
    """Pods on the node: per card free, held whole, or 1-3 shares; now and then two cards held together."""
    out = []
    minors = [g.minor for g in inv.gpus]
    cards = list(range(len(minors)))
    rng.shuffle(cards)
    if len(cards) >= 4 and rng.random() < 0.25:
        a, b = cards.pop(), cards.pop()
        out.append(holding(f"{name}-{tag}-pair", name, [(200, 0, [minors[a], minors[b]])]))
    for c in cards:
        r = rng.random()
        if r < 0.4:
            continue
        if r < 0.6:
            out.append(holding(f"{name}-{tag}-w{c}", name, [(100, 0, [minors[c]])]))
            continue
        cores, units = 100, inv.gpus[c].memory_mib // UNIT
        for s in range(rng.randint(1, 3)):
            want_c, want_u = rng.choice([5, 10, 20, 30, 45]), rng.choice([2, 4, 8, 16, 24])
            if want_c > cores or want_u > units:
                break
            cores, units = cores - want_c, units - want_u
            out.append(holding(f"{name}-{tag}-s{c}-{s}", name, [(want_c, want_u, [minors[c]])]))
    return out


def an_ask(rng: random.Random, uuids: list[str]) -> dict[str, Any]:
    share = lambda: (rng.choice([5, 10, 25, 40, 50, 70, 99]), rng.choice([1, 4, 8, 16, 32, 60]))  # noqa: E731
    whole = lambda: (rng.choice([100, 100, 200, 300, 400, 800]), 0)  # noqa: E731
    kind = rng.random()
    if kind < 0.45:
        containers = [share()]
    elif kind < 0.75:
        containers = [whole()]
    else:
        containers = [rng.choice([share, whole])() for _ in range(rng.randint(2, 3))]
    ann: dict[str, str] = {}
    if rng.random() < 0.4:
        ann[ANN_POLICY] = rng.choice(["binpack", "spread", "topology"])
    if rng.random() < 0.15:
        ann["gpumgr.io/gpu-model"] = "t4"
    if rng.random() < 0.1:
        ann[ANN_UUID_EXCLUDE] = ",".join(rng.sample(uuids, 6))
    elif rng.random() < 0.05:
        ann[ANN_UUID_SELECT] = ",".join(rng.sample(uuids, 12))
    return pod(f"ask-{rng.randrange(10**9)}", containers, annotations=ann)


def cluster(seed: int, nodes: int,
            high_first: bool = False) -> tuple[ClusterView, random.Random, dict[str, Inventory], list[str]]:
    rng = random.Random(seed)
    view = ClusterView(high_first=high_first)
    invs: dict[str, Inventory] = {}
    texts: dict[str, str] = {}
    cordons: dict[str, str | None] = {}
    for k in range(nodes):
        name = f"n{k:03d}"
        inv, sick = hardware(rng, k)
        invs[name] = inv
        texts[name] = node_inventory.encode(inv, frozenset(sick), UNIT)
        cordons[name] = ",".join(map(str, rng.sample(range(len(inv.gpus)), 2))) if rng.random() < 0.1 else None
    view.replace_nodes(texts, cordons)
    view.replace_pods([p for n, inv in invs.items() for p in holdings(rng, n, inv, "a")])
    uuids = [g.uuid for inv in invs.values() for g in inv.gpus]
    return view, rng, invs, uuids


def plain(view: ClusterView, name: str, ask: PodAsk) -> Fit:
    """The answer from first principles: the node's ledger, its hardware, the pod's choices and the cordon."""
    node = view.nodes[name]
    shape = node.shape
    assert shape is not None
    allowed, never = static_check(shape.models, shape.memory_mib, shape.unit_mib, ask)
    if never is not None:
        return never
    if ask.choices.constrains or node.cordon.cards:
        mine = allowed_cards(node.gpus, ask.choices, node.cordon)
        allowed = tuple(a and m for a, m in zip(allowed, mine.mask(len(allowed)), strict=True))
        if not mine.cards:
            return Fit.never(mine.why_none())
        if not any(allowed):
            return Fit.never(f"{mine.describe()}, and none of them is of an accepted model")
    ledger = node.ledger.copy()
    return with_packing(place(shape.topology, ledger, allowed, shape.unit_mib, ask, view.high_first), ledger, allowed,
                        shape.unit_mib, ask)


def same(got: Fit, want: Fit, placed: bool) -> bool:
    if (got.ok, got.unresolvable, got.reason) != (want.ok, want.unresolvable, want.reason):
        return False
    return not placed or (got.cards, got.worst, got.packing, got.points) == (want.cards, want.worst, want.packing,
                                                                            want.points)


def check(view: ClusterView, ask: PodAsk, names: list[str], uid: str) -> list[Fit]:
    verdicts = view.verdicts(ask, uid, names)
    passed = [n for n, f in zip(names, verdicts, strict=True) if f.ok]
    placements = view.placements(ask, uid, passed)
    want = {n: plain(view, n, ask) for n in names}
    for n, f in zip(names, verdicts, strict=True):
        assert same(f, want[n], placed=False), f"{ask.key} on {n}: verdict {f} != {want[n]}"
    for n, f in zip(passed, placements, strict=True):
        assert same(f, want[n], placed=True), f"{ask.key} on {n}: placement {f} != {want[n]}"
    for policy in ("binpack", "spread"):
        assert scores(placements, policy) == scores([want[n] for n in passed], policy)
    return placements


@pytest.mark.parametrize("high_first", [False, True], ids=["low-first", "high-first"])
@pytest.mark.parametrize("seed", range(4))
def test_the_views_answers_are_those_of_placing_from_the_ledger(seed: int, high_first: bool) -> None:
    view, rng, _invs, uuids = cluster(seed, 90, high_first)
    names = sorted(view.nodes)
    for k in range(40):
        check(view, pod_ask(an_ask(rng, uuids)), names, f"pod-{seed}-{k}")


@pytest.mark.parametrize("high_first", [False, True], ids=["low-first", "high-first"])
@pytest.mark.parametrize("seed", range(3))
def test_pods_coming_and_going_are_reflected_in_the_next_answers(seed: int, high_first: bool) -> None:
    view, rng, invs, uuids = cluster(100 + seed, 60, high_first)
    names = sorted(view.nodes)
    asks = [pod_ask(an_ask(rng, uuids)) for _ in range(12)]
    placed: dict[str, list[dict[str, Any]]] = {}
    for step in range(6):
        for k, ask in enumerate(asks):  # the caches fill with these asks' answers ...
            check(view, ask, names, f"pod-{seed}-{k}")
        for name in rng.sample(names, 15):  # ... and then pods leave and arrive on some nodes
            for p in placed.pop(name, []):
                view.remove_pod(p)
            if rng.random() < 0.7:
                placed[name] = holdings(rng, name, invs[name], f"b{step}")
                for p in placed[name]:
                    view.set_pod(p)


def test_a_pod_on_one_node_changes_that_nodes_answer_only() -> None:
    view, rng, _invs, _uuids = cluster(7, 40)
    names = sorted(view.nodes)
    ask = pod_ask(pod("share", [(30, 8)]))
    before = dict(zip(names, view.placements(ask, "share", names), strict=True))
    target = next(n for n in names if before[n].ok)
    node = view.nodes[target]
    assert node.shape is not None
    (card,) = before[target].cards[0]
    view.set_pod(holding("taker", target, [(100, 0, [node.shape.minors((card,))[0]])]))
    after = dict(zip(names, view.placements(ask, "share", names), strict=True))
    assert card not in {c for cs in after[target].cards for c in cs}
    assert same(after[target], plain(view, target, ask), placed=True)
    assert all(after[n] is before[n] for n in names if n != target)  # the other nodes' answers stay cached
    view.remove_pod(holding("taker", target, [(100, 0, [node.shape.minors((card,))[0]])]))
    again = view.placements(ask, "share", [target])[0]
    assert same(again, before[target], placed=True)


def test_a_cordon_change_is_seen_by_the_next_answer() -> None:
    view, _rng, invs, _uuids = cluster(8, 10)
    name = "n000"
    ask = pod_ask(pod("one", [(100, 0)]))
    first = view.placements(ask, "one", [name])[0]
    assert first.ok
    text = node_inventory.encode(invs[name], frozenset(), UNIT)
    view.set_node(name, text, ",".join(str(i) for i in range(len(invs[name].gpus))))
    assert ANN_CORDON
    cordoned = view.verdicts(ask, "one", [name])[0]
    assert not cordoned.ok and cordoned.unresolvable == plain(view, name, ask).unresolvable


def _nx_link(topo: Topology, usable: list[int], free: list[int], count: int,
             high_first: bool = False) -> tuple[int, ...]:
    """The clique search `choose_link` made before `link_among` learnt to enumerate small nodes' sets."""
    if count == len(usable):
        return tuple(usable)
    for threshold in topo.distinct_keys():
        g = nx.Graph()
        g.add_nodes_from(usable)
        g.add_edges_from((a, b) for a, b in itertools.combinations(usable, 2) if topo.keys[a][b] <= threshold)
        cliques = [sorted(c) for c in nx.find_cliques(g) if len(c) >= count]
        if cliques:
            return link._best_in(topo, cliques, count, free, high_first)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("high_first", [False, True], ids=["low-first", "high-first"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_whole_card_sets_are_those_of_the_clique_search(fixture: str, high_first: bool) -> None:
    topo = Topology.of(topo_inventory(fixture))
    for free_bits in range(1 << topo.n):
        free = [c for c in range(topo.n) if free_bits >> c & 1]
        for usable_bits in (free_bits, free_bits & 0b01101101):
            usable = [c for c in free if usable_bits >> c & 1]
            for count in range(2, len(usable) + 1):
                assert (link.link_among(topo, usable, free, count, high_first)
                        == _nx_link(topo, usable, free, count, high_first))
            assert rank_free(topo, usable, high_first) == _rank_free(topo, usable, high_first)
