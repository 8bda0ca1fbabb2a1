"""Who the extender's view counts when holdings conflict (a claim the node refused, pods racing for one card) does
not depend on the order the watches deliver them: a pod goes before a DRA claim, a holder keeps its place when it
is updated or its node is rebuilt, and waiting holders are admitted oldest first."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpumgr.extender.cluster import ClusterView
from gpumgr.node import inventory as node_inventory
from gpumgr.requests.claim_results import DriverResult
from tests.extender.support import holding, inventory

TEXT = node_inventory.encode(inventory(1), frozenset(), 256)


def running(name: str, cores: int = 60, units: int = 32) -> dict[str, Any]:
    p = holding(name, "n", [(cores, units, [0])])
    p["metadata"]["uid"] = name
    return p


REFUSED_CLAIM = ("late", "ns", "late", (DriverResult(n=0, pool="n", index=0, cores=50, memory_mib=2048),))


def counted(view: ClusterView) -> tuple[list[str], list[str], int]:
    n = view.nodes["n"]
    return sorted(n.keys), list(n.waiting), n.ledger.cards[0].used_cores


@pytest.mark.parametrize("order", list(itertools.permutations(("pods", "claims"))))
def test_after_a_restart_the_running_pod_is_counted_whatever_list_comes_first(order):
    view = ClusterView()
    view.needs.add("resourceclaims")
    view.replace_nodes({"n": TEXT})
    for what in order:
        if what == "pods":
            view.replace_pods([running("gm")])
        else:
            view.replace_claims([REFUSED_CLAIM])
    assert counted(view) == (["gm"], ["dra/late"], 60)


def test_a_pod_update_and_a_node_rebuild_keep_the_pod_counted_over_the_claim():
    view = ClusterView()
    view.replace_nodes({"n": TEXT})
    view.set_claim(*REFUSED_CLAIM)
    view.set_pod(running("gm"))
    assert counted(view) == (["gm"], ["dra/late"], 60)
    view.set_pod(running("gm"))  # e.g. the agent's annotation patch
    assert counted(view) == (["gm"], ["dra/late"], 60)
    view.set_node("n", TEXT, '{"0": "maintenance"}')  # the node object changed: its state is built again
    assert counted(view) == (["gm"], ["dra/late"], 60)
    view.remove_pod(running("gm"))
    assert counted(view) == (["dra/late"], [], 50)


def test_conflicting_pods_keep_their_turn_through_updates_and_rebuilds():
    view = ClusterView()
    view.replace_nodes({"n": TEXT})
    for name in ("z-first", "b-second", "a-third"):
        view.set_pod(running(name, cores=100, units=0))
    assert counted(view) == (["z-first"], ["b-second", "a-third"], 100)
    view.set_pod(running("b-second", cores=100, units=0))  # an update of a waiting pod keeps its turn
    view.set_node("n", TEXT, '{"0": "x"}')  # a rebuild keeps the order too (not the UIDs' order)
    assert counted(view) == (["z-first"], ["b-second", "a-third"], 100)
    view.remove_pod(running("z-first", cores=100, units=0))
    assert counted(view) == (["b-second"], ["a-third"], 100)


def test_a_claim_displaced_from_two_cards_frees_both_in_the_card_rows():
    text = node_inventory.encode(inventory(2), frozenset(), 256)
    view = ClusterView()
    view.replace_nodes({"n": text})
    both = tuple(DriverResult(n=i, pool="n", index=i, cores=100, memory_mib=None) for i in range(2))
    view.set_claim("wide", "ns", "wide", both)
    view.nodes["n"].refresh()  # rows current: from now on only the cards a change names are brought up to date
    p = holding("gm", "n", [(100, 0, [0])])
    p["metadata"]["uid"] = "gm"
    view.set_pod(p)
    n = view.nodes["n"]
    n.refresh()
    assert sorted(n.keys) == ["gm"] and list(n.waiting) == ["dra/wide"]
    assert [r.mode for r in n.rows] == [n.ledger.cards[i].mode for i in range(2)] == ["exclusive", "free"]


def test_an_unchanged_update_keeps_the_holders_order():
    view = ClusterView()
    view.replace_nodes({"n": node_inventory.encode(inventory(2), frozenset(), 256)})
    a, b = holding("a", "n", [(30, 4, [0])]), holding("b", "n", [(30, 4, [1])])
    a["metadata"]["uid"], b["metadata"]["uid"] = "a", "b"
    view.set_pod(a)
    view.set_pod(b)
    view.set_pod(a)
    assert list(view.nodes["n"].keys) == ["a", "b"]
