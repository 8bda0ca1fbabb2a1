"""A new ask's first call answers nodes by class (plan.py): nodes whose cards differ in pattern but not in what the
answer depends on share one answer, and that answer must be each node's own.

Nodes of one hardware with every mix of free, whole-held, shared and unhealthy cards: whole-card asks that do not
fit (the same counts of free and healthy cards, in different places), shares that no shared card can take (they go
on a free card, whatever the busy cards are), and shares and whole cards that fit; every verdict, placement and
score must equal the plain computation (`test_fit_cache.plain`), packing to the last bit, in both tie orders
(`ClusterView(high_first=...)`).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpumgr.extender.ask import pod_ask
from gpumgr.extender.cluster import ClusterView
from gpumgr.node import inventory as node_inventory
from tests.extender.support import holding, pod, topo_inventory
from tests.extender.test_fit_cache import UNIT, check

FIXTURES = ["dgx-a100-8x_epyc7742_10nic_numa3175_tabs.txt", "t4-4x_pcie_2socket_1-3-split_sys-node.txt"]
ASKS = [[(800, 0)], [(400, 0)], [(300, 0)], [(200, 0)], [(100, 0)], [(99, 60)], [(90, 40)], [(60, 8)], [(30, 8)],
        [(5, 1)], [(40, 8), (40, 8)], [(70, 32), (20, 4)]]


def cluster(seed: int, nodes: int, high_first: bool = False) -> ClusterView:
    """Nodes whose cards are each free, held whole, shared (a little or almost full) or unhealthy, at random."""
    rng = random.Random(seed)
    view = ClusterView(high_first=high_first)
    texts: dict[str, str] = {}
    pods: list[dict[str, Any]] = []
    for k in range(nodes):
        name = f"n{k:03d}"
        inv = topo_inventory(FIXTURES[k % len(FIXTURES)], memory_mib=16384)
        sick = frozenset(i for i in range(len(inv.gpus)) if rng.random() < 0.15)
        texts[name] = node_inventory.encode(inv, sick, UNIT)
        for g in inv.gpus:
            r = rng.random()
            if r < 0.4:
                continue
            if r < 0.65:
                pods.append(holding(f"{name}-w{g.index}", name, [(100, 0, [g.minor])]))
            else:
                cores, units = rng.choice([(10, 4), (50, 16), (90, 56), (95, 60), (30, 60)])
                pods.append(holding(f"{name}-s{g.index}", name, [(cores, units, [g.minor])]))
    view.replace_nodes(texts)
    view.replace_pods(pods)
    return view


@pytest.mark.parametrize("high_first", [False, True], ids=["low-first", "high-first"])
@pytest.mark.parametrize("seed", range(3))
def test_nodes_answered_by_class_get_their_own_answers(seed: int, high_first: bool) -> None:
    view = cluster(seed, 150, high_first)
    names = sorted(view.nodes)
    for k, containers in enumerate(ASKS):
        for policy in ("", "binpack", "topology", "spread"):
            ann = {"gpumgr.io/gpu-policy": policy} if policy else {}
            ask = pod_ask(pod(f"ask-{k}-{policy}", containers, annotations=ann))
            check(view, ask, names, f"pod-{seed}-{k}-{policy}")


def test_refusals_of_whole_cards_name_each_nodes_counts() -> None:
    view = cluster(7, 150)
    names = sorted(view.nodes)
    ask = pod_ask(pod("eight", [(800, 0)]))
    reasons = {f.reason for f in view.verdicts(ask, "eight", names) if not f.ok}
    assert len(reasons) > 3  # several classes of refusal, each with its own counts
    check(view, ask, names, "eight-again")


@pytest.mark.parametrize("containers", [[(100, 0)], [(60, 8)]])
def test_a_model_filter_packs_by_the_used_cores_of_the_allowed_cards_only(containers: list[Any]) -> None:
    """Two nodes alike but for how their used cores split between the cards the pod may take (A100) and those it
    may not (T4): each is packed, and scored, by its own allowed cards."""
    from gpumgr.extender.fit import Fit
    from tests.extender.support import A100, T4, inventory
    from tests.extender.test_fit_cache import plain

    inv = inventory(4, models=[A100, A100, T4, T4], memory_mib=16384)
    view = ClusterView()
    view.replace_nodes({n: node_inventory.encode(inv, frozenset(), 256) for n in ("a", "b")})
    view.replace_pods([holding("a1", "a", [(70, 8, [1])]), holding("a2", "a", [(5, 8, [2])]),
                       holding("b1", "b", [(5, 8, [1])]), holding("b2", "b", [(70, 8, [2])])])
    ask = pod_ask(pod("p", containers, annotations={"gpumgr.io/gpu-model": "a100"}))
    view.verdicts(ask, "p", ["a", "b"])
    got: list[Fit] = view.placements(ask, "p", ["a", "b"])
    for name, fit in zip("ab", got, strict=True):
        want = plain(view, name, ask)
        assert (fit.cards, fit.packing, fit.points) == (want.cards, want.packing, want.points), name
