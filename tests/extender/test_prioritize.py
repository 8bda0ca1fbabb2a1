"""Prioritize over HTTP: bin-pack or spread on the cards the pod would use, topology before packing."""

from __future__ import annotations

import itertools
from typing import Any

from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, holding, inventory, node, pod


def pairs_levels(n: int) -> list[list[str]]:
    """Cards 2k and 2k+1 joined by NVLink, everything else across sockets."""
    lv = [["X"] * n for _ in range(n)]
    for a, b in itertools.combinations(range(n), 2):
        lv[a][b] = lv[b][a] = "NV4" if a // 2 == b // 2 else "SYS"
    return lv


async def seed_packing(api: KubeApiServer) -> None:
    s = api.store
    s.create_node(node("empty", inventory(1)))
    s.create_node(node("half", inventory(1)))
    s.create_node(node("most", inventory(1)))
    s.create_node(node("full", inventory(1)))
    s.create_pod(holding("h", "half", [(50, 40, [0])]))
    s.create_pod(holding("m", "most", [(70, 100, [0])]))
    s.create_pod(holding("f", "full", [(100, 0, [0])]))


async def test_binpack_prefers_the_fuller_card(api: KubeApiServer, start_extender: Any) -> None:
    await seed_packing(api)
    p = api.store.create_pod(pod("p", [(20, 8)]))
    ext = await start_extender()

    s = await ext.prioritize(args(p, ["empty", "half", "most", "full"]))

    assert s["most"] > s["half"] > s["empty"]
    assert s["full"] == 0  # does not fit
    assert all(isinstance(v, int) and 0 <= v <= 10 for v in s.values())


async def test_spread_prefers_the_emptier_card(api: KubeApiServer, start_extender: Any) -> None:
    await seed_packing(api)
    p = api.store.create_pod(pod("p", [(20, 8)]))
    ext = await start_extender(policy="spread")

    s = await ext.prioritize(args(p, ["empty", "half", "most", "full"]))

    assert s["empty"] > s["half"] > s["most"]
    assert s["full"] == 0


async def test_better_links_outweigh_packing(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("nvlink", inventory(8, levels=pairs_levels(8))))  # empty: a free NVLink pair
    s.create_node(node("sys", inventory(4, levels=pairs_levels(4))))
    s.create_pod(holding("x", "sys", [(100, 0, [1])]))  # fuller, but its free cards are 0, 2, 3 ...
    s.create_pod(holding("y", "sys", [(100, 0, [3])]))  # ... then 0 and 2: joined across sockets only
    p = s.create_pod(pod("pair", [(200, 0)]))
    one = s.create_pod(pod("one", [(100, 0)]))
    ext = await start_extender()

    pair = await ext.prioritize(args(p, ["sys", "nvlink"]))
    assert pair["nvlink"] > pair["sys"]
    single = await ext.prioritize(args(one, ["sys", "nvlink"]))
    assert single["sys"] > single["nvlink"]  # no links involved: bin-packing decides


async def test_scores_are_deterministic_and_in_the_order_asked(api: KubeApiServer, start_extender: Any) -> None:
    await seed_packing(api)
    p = api.store.create_pod(pod("p", [(20, 8)]))
    ext = await start_extender()
    names = ["full", "most", "empty", "half", "unknown"]

    status, first = await ext.post("prioritize", args(p, names))
    _, second = await ext.post("prioritize", args(p, names))

    assert status == 200
    assert [h["Host"] for h in first] == names
    assert first == second
    assert first[-1]["Score"] == 0


async def test_non_gpu_pods_score_zero_everywhere(api: KubeApiServer, start_extender: Any) -> None:
    await seed_packing(api)
    p = api.store.create_pod(pod("web", [(0, 0)]))
    ext = await start_extender()

    assert set((await ext.prioritize(args(p, ["empty", "half"]))).values()) == {0}
