"""Evaluators and ledger: optimal worst link, groups kept intact, best-fit shares, clean refusals."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumgr.allocator import Allocation, InvalidRequest, Ledger, LedgerError, NoFit, Request, choose
from gpumgr.devices.topo_text import parse_topo_text
from gpumgr.topology.cost import Topology
from tests.helpers import TOPO_FILES, topo_path

MEM = 16384


def topology_of(path) -> Topology:
    return Topology(parse_topo_text(path.read_text()).levels)


def brute_best_worst(topo: Topology, free: list[int], k: int):
    return min(topo.worst(c) for c in itertools.combinations(free, k))


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_link_is_worst_link_optimal_for_every_size(path):
    topo = topology_of(path)
    rng = random.Random(path.name)
    scenarios = [set()]
    if topo.n >= 4:
        scenarios += [set(rng.sample(range(topo.n), topo.n // 4)), set(rng.sample(range(topo.n), topo.n // 2))]
    for sick in scenarios:
        ledger = Ledger([MEM] * topo.n)
        for s in sick:
            ledger.set_healthy(s, False)
        free = [i for i in range(topo.n) if i not in sick]
        for k in range(2, len(free) + 1):
            got = choose(topo, ledger, Request(cores=100 * k))
            assert got.evaluator == "link"
            assert len(set(got.cards)) == k and not set(got.cards) & sick
            assert topo.worst(got.cards) == brute_best_worst(topo, free, k), (sick, k, got.cards)


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_link_breaks_ties_by_lowest_total_cost(path):
    topo = topology_of(path)
    if topo.n > 8:
        pytest.skip("exhaustive cost check is for small nodes")
    ledger = Ledger([MEM] * topo.n)
    for k in range(2, topo.n):
        got = choose(topo, ledger, Request(cores=100 * k)).cards
        best = brute_best_worst(topo, list(range(topo.n)), k)
        cheapest = min(topo.total_cost(c) for c in itertools.combinations(range(topo.n), k) if topo.worst(c) == best)
        assert topo.total_cost(got) == pytest.approx(cheapest), (k, got)


def test_link_leaves_the_larger_group_intact():
    topo = topology_of(topo_path("p40"))  # PIX(0,1,2) and PIX(3,4,5,6) under one PHB
    ledger = Ledger([MEM] * 7)
    assert choose(topo, ledger, Request(cores=200)).cards in {(0, 1), (0, 2), (1, 2)}
    assert set(choose(topo, ledger, Request(cores=300)).cards) == {0, 1, 2}
    assert set(choose(topo, ledger, Request(cores=400)).cards) == {3, 4, 5, 6}


def test_link_on_the_hybrid_cube_mesh_takes_an_all_nvlink_quad():
    topo = topology_of(topo_path("dgx1"))
    cards = choose(topo, Ledger([MEM] * 8), Request(cores=400)).cards
    assert all(topo.levels[a][b].startswith("NV") for a, b in itertools.combinations(cards, 2))


def test_fragment_takes_the_most_isolated_card():
    topo = topology_of(topo_path("p40"))
    ledger = Ledger([MEM] * 7)
    first = choose(topo, ledger, Request(cores=100))
    assert first.evaluator == "fragment" and first.cards[0] in (0, 1, 2)
    # on the 1+3 split T4 node, the lone socket-0 card goes first
    t4 = topology_of(topo_path("t4"))
    assert choose(t4, Ledger([MEM] * 4), Request(cores=100)).cards == (0,)
    # with NVLink pairs, take the card whose partner is already gone
    a30 = topology_of(topo_path("a30"))
    ledger = Ledger([MEM] * 4)
    ledger.assign(Allocation("x", (1,), 100))
    assert choose(a30, ledger, Request(cores=100)).cards == (0,)


def test_share_best_fit_prefers_shared_cards_and_never_exclusive():
    topo = topology_of(topo_path("a10-"))
    ledger = Ledger([MEM] * 4)
    ledger.assign(Allocation("whole", (0,), 100))
    ledger.assign(Allocation("s1", (1,), 50, 4096))
    ledger.assign(Allocation("s2", (2,), 80, 4096))
    got = choose(topo, ledger, Request(cores=20, memory_mib=1024))
    assert got.evaluator == "share" and got.cards == (2,)  # tightest fit: 20 free cores left there
    assert choose(topo, ledger, Request(cores=40, memory_mib=1024)).cards == (1,)
    assert choose(topo, ledger, Request(cores=60, memory_mib=1024)).cards == (3,)  # only the free card fits


def test_whole_card_never_lands_on_a_shared_card():
    topo = topology_of(topo_path("gtx1080ti"))
    ledger = Ledger([MEM] * 2)
    ledger.assign(Allocation("s", (0,), 10, 256))
    assert choose(topo, ledger, Request(cores=100)).cards == (1,)
    ledger.assign(Allocation("w", (1,), 100))
    with pytest.raises(NoFit, match="needs 1 free whole card, none free"):
        choose(topo, ledger, Request(cores=100))
    with pytest.raises(NoFit, match="needs 2 free whole cards, 0 free"):
        choose(topo, ledger, Request(cores=200))


def test_share_refusal_names_the_shortfall():
    topo = topology_of(topo_path("gtx1080ti"))
    ledger = Ledger([MEM] * 2)
    ledger.assign(Allocation("a", (0,), 50, 256))
    ledger.assign(Allocation("b", (1,), 50, 256))
    with pytest.raises(NoFit, match="needs 60 cores and 1024 MiB on one card; the best cards have 50 free cores"):
        choose(topo, ledger, Request(cores=60, memory_mib=1024))


def test_unhealthy_cards_are_never_chosen():
    topo = topology_of(topo_path("gtx1080ti"))
    ledger = Ledger([MEM] * 2)
    ledger.set_healthy(0, False)
    for req in (Request(100), Request(30, 256)):
        assert choose(topo, ledger, req).cards == (1,)
    ledger.set_healthy(1, False)
    with pytest.raises(NoFit):
        choose(topo, ledger, Request(30, 256))


@pytest.mark.parametrize(
    ("req", "words"),
    [
        (Request(150), "multiple of 100"),
        (Request(30, 0), "needs vcuda-memory > 0"),
        (Request(30, 99999), "largest card has 16384 MiB"),
        (Request(-10, 256), "negative"),
        (Request(50, -1), "negative"),
        (Request(0, 256), "greater than 0"),
        (Request(300), "asks 3 whole cards, but the node has 2"),
    ],
)
def test_invalid_requests_are_refused_and_change_nothing(req, words):
    topo = topology_of(topo_path("gtx1080ti"))
    ledger = Ledger([MEM] * 2)
    before = ledger.to_json()
    with pytest.raises(InvalidRequest, match=words):
        choose(topo, ledger, req)
    assert ledger.to_json() == before


def test_ledger_assign_is_all_or_nothing_and_release_is_exact():
    ledger = Ledger([MEM] * 3)
    ledger.assign(Allocation("s", (1,), 30, 1024))
    before = ledger.to_json()
    with pytest.raises(LedgerError, match="card 1 is shared"):
        ledger.assign(Allocation("w", (0, 1), 200))
    assert ledger.to_json() == before and ledger.cards[0].mode == "free"
    with pytest.raises(LedgerError, match="already holds"):
        ledger.assign(Allocation("s", (2,), 10, 256))
    with pytest.raises(LedgerError, match="no card 7"):
        ledger.assign(Allocation("x", (7,), 10, 256))
    assert ledger.release("nobody") is None
    assert ledger.to_json() == before
    ledger.release("s")
    assert ledger.cards[1].free_cores == 100 and ledger.cards[1].free_memory_mib == MEM


ops = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from([10, 25, 30, 50, 70, 100, 200, 300, 400]),
                  st.sampled_from([1, 4, 16, 40])),
        st.tuples(st.just("release"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("sick"), st.integers(0, 7), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_random_workloads_never_overcommit_and_releases_restore(ops):
    topo = topology_of(topo_path("baobab"))
    ledger = Ledger([MEM] * 8)
    live: list[str] = []
    for n, (kind, a, b) in enumerate(ops):
        if kind == "ask":
            req = Request(a, b * 256 if a < 100 else 0)
            try:
                placed = choose(topo, ledger, req)
            except NoFit:
                if a < 100:
                    assert not any(c.healthy and c.mode != "exclusive" and c.free_cores >= a
                                   and c.free_memory_mib >= req.memory_mib for c in ledger.cards)
                else:
                    assert sum(1 for c in ledger.cards if c.healthy and c.mode == "free") < a // 100
                continue
            ledger.assign(Allocation(f"p{n}", placed.cards, req.cores, req.memory_mib))
            live.append(f"p{n}")
        elif kind == "release" and live:
            ledger.release(live.pop(a % len(live)))
        elif kind == "sick":
            ledger.set_healthy(a, b)
        for c in ledger.cards:
            assert 0 <= c.free_cores <= 100 and 0 <= c.free_memory_mib <= c.memory_mib
            assert sum(h.cores for h in c.holders.values()) <= 100
            if c.mode == "exclusive":
                assert len(c.holders) == 1
    for key in list(live):
        ledger.release(key)
    assert all(c.mode == "free" and c.free_cores == 100 and c.free_memory_mib == MEM for c in ledger.cards)
