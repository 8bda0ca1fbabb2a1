"""Where the extender counts DRA claims (`both` mode), it breaks ties between equally good cards towards the highest
card number: kube-scheduler's DRA allocator tries a node's devices in slice order (`gpu-0` first) and takes the
first that fits, so the two schedulers take a node's cards from opposite ends instead of racing for the same one
before either sees the other's choice (docs/dra.md, "Why (d) shows over-committed cards"). The placement stays as
good as the plain one (`gpumgr place`): the same worst link and total link cost, the same fit.

Through the extender's HTTP API (filter, bind) on the API test server, with claims allocated as the DRA allocator
allocates them (lowest devices first); and on the allocator for every set of free cards of the bench's boards."""

from __future__ import annotations

from typing import Any

import pytest

from gpumgr.allocator import Allocation, Ledger, Request, choose
from gpumgr.allocator.candidates import group_pressure, isolation, snugness
from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.topology.cost import Topology
from tests.extender.support import args, node, pod, topo_inventory
from tests.extender.test_dra_claims import claim, result

ALL_NVLINK = "h100-8x_hgx_12nic_numa-off_tabs.txt"  # every pair NV18, no NUMA: every card as good as another
BOARDS = [ALL_NVLINK, "baobab-gpu048_8x-rtxa6000_nvlink-pairs_2socket_2nic.txt",
          "dgx1-like_8x-v100-sxm2_hybrid-cube-mesh_mlx5.txt", "dgx-a100-8x_epyc7742_10nic_numa3175_tabs.txt"]
SHAPES = [(100, 0), (200, 0), (400, 0), (30, 16)]  # (vcuda-core, vcuda-memory units): whole cards and a share


async def placed(ext: Any, store: Any, name: str, containers: tuple[int, int]) -> tuple[int, ...]:
    """The cards (minors = indices here) the extender gives a new pod on node "n": filter, then bind."""
    p = store.create_pod(pod(name, [containers]))
    doc = await ext.filter(args(p, ["n"]))
    assert doc["NodeNames"] == ["n"], doc
    assert await ext.bind(p, "n") == ""
    ann = (store.get_pod("default", name) or {})["metadata"]["annotations"]
    return tuple(int(m) for m in ann[f"{podspec.ANN_PREDICATE_IDX}0"].split(","))


@pytest.mark.parametrize("containers", [(100, 0), (200, 0), (30, 16)], ids=lambda c: f"{c[0]}-cores")
async def test_on_a_half_full_node_the_extender_leaves_the_cards_the_dra_allocator_takes_next(
        api: KubeApiServer, start_extender: Any, containers: tuple[int, int]) -> None:
    s = api.store
    inv = topo_inventory(ALL_NVLINK, memory_mib=81559)
    topo = Topology.of(inv)
    s.create_node(node("n", inv))
    for i in range(4):  # the DRA allocator's claims: gpu-0 first
        s.create_object("resourceclaims", claim(f"c{i}", [result("n", i)]))
    ext = await start_extender(dra_claims="on")

    got = await placed(ext, s, "want", containers)

    dra_next = 4  # the lowest free card: the one the DRA allocator's next claim takes
    assert dra_next not in got, got
    count = max(1, containers[0] // 100)
    assert got == tuple(range(8 - count, 8))  # the highest of the equally good cards
    plain = _plain(topo, 8, set(range(4)), containers)  # `gpumgr place` on the same node
    assert dra_next in plain  # ... which takes the DRA allocator's next card
    assert topo.worst(got) == topo.worst(plain)
    assert round(topo.total_cost(got), 6) == round(topo.total_cost(plain), 6)


async def test_without_dra_claims_the_order_is_the_plain_one(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", topo_inventory(ALL_NVLINK, memory_mib=81559)))
    ext = await start_extender(dra_claims="off")
    assert not ext.server.view.high_first
    assert await placed(ext, s, "one", (100, 0)) == (0,)
    assert await placed(ext, s, "two", (200, 0)) == (1, 2)


async def test_pods_and_claims_fill_a_node_from_opposite_ends(api: KubeApiServer, start_extender: Any) -> None:
    """Pods through the extender, claims allocated as the DRA allocator allocates them (the lowest free device),
    in turn: the pods take 7, 6, 5, 4 while the claims take 0, 1, 2, 3; no card is taken twice."""
    s = api.store
    s.create_node(node("n", topo_inventory(ALL_NVLINK, memory_mib=81559)))
    ext = await start_extender()  # --dra-claims auto: the API serves resourceclaims
    assert ext.server.view.high_first
    pods: list[int] = []
    for k in range(4):
        s.create_object("resourceclaims", claim(f"c{k}", [result("n", k)]))  # seen by the extender or not yet
        (card,) = await placed(ext, s, f"p{k}", (100, 0))
        pods.append(card)
    assert pods == [7, 6, 5, 4]


@pytest.mark.parametrize("board", BOARDS)
def test_the_high_first_order_is_as_good_as_the_plain_one(board: str) -> None:
    """Every set of busy cards, every shape: the same worst link, total cost, NUMA span and snugness for whole
    cards, the same isolation, NUMA peers and group pressure for one card or a share (every busy card is held whole
    here, so a share takes a free card in the same order); only the last tie-break, the card numbers, differs."""
    topo = Topology.of(topo_inventory(board))
    for bits in range(1 << topo.n):
        busy = {c for c in range(topo.n) if bits >> c & 1}
        free = [c for c in range(topo.n) if c not in busy]
        for containers in SHAPES:
            count = max(1, containers[0] // 100)
            if count > len(free):
                continue
            plain = _plain(topo, topo.n, busy, containers)
            high = _plain(topo, topo.n, busy, containers, high_first=True)
            assert topo.worst(high) == topo.worst(plain), (busy, containers)
            assert round(topo.total_cost(high), 6) == round(topo.total_cost(plain), 6), (busy, containers)
            assert topo.numa_span(high) == topo.numa_span(plain), (busy, containers)
            assert snugness(topo, list(high), free) == snugness(topo, list(plain), free), (busy, containers)
            if count == 1:
                assert isolation(topo, high[0], free) == isolation(topo, plain[0], free), (busy, containers)
                assert topo.numa_peers(high[0], free) == topo.numa_peers(plain[0], free), (busy, containers)
                assert group_pressure(topo, high[0], free) == group_pressure(topo, plain[0], free), (busy, containers)


def _plain(topo: Topology, n: int, busy: set[int], containers: tuple[int, int],
           high_first: bool = False) -> tuple[int, ...]:
    ledger = Ledger([81559] * n)
    for i in sorted(busy):
        ledger.assign(Allocation(key=f"busy-{i}", cards=(i,), cores=100, memory_mib=0))
    cores, units = containers
    return choose(topo, ledger, Request(cores=cores, memory_mib=units * 256), high_first=high_first).cards
