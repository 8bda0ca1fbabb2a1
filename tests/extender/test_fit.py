"""The fit steps against the allocator: the quick verdict agrees with placing, and a placement always assigns."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.extender.ask import pod_ask
from gpumgr.extender.fit import place, quick_check, static_check
from gpumgr.topology.cost import Topology
from tests.extender.support import A100, T4, pod, topo_inventory

INV = topo_inventory("dgx1-like_8x-v100-sxm2_hybrid-cube-mesh_mlx5.txt", memory_mib=16384)
TOPO = Topology(INV.levels)
MODELS = [A100] * 6 + [T4] * 2
UNIT = 256


@st.composite
def ledgers(draw: Any) -> Ledger:
    ledger = Ledger([16384] * 8)
    for i in range(8):
        kind = draw(st.sampled_from(["free", "whole", "shared", "shared2"]))
        if kind == "whole":
            ledger.assign(Allocation(f"w{i}", (i,), 100), check_health=False)
        elif kind.startswith("shared"):
            for k in range(1 if kind == "shared" else 2):
                ledger.assign(Allocation(f"s{i}-{k}", (i,), draw(st.sampled_from([10, 30, 45])),
                                         draw(st.sampled_from([1024, 4096, 8192]))), check_health=False)
        if draw(st.booleans()) and draw(st.booleans()):
            ledger.set_healthy(i, False)
    return ledger


containers = st.one_of(
    st.tuples(st.sampled_from([5, 20, 50, 60, 99]), st.sampled_from([1, 8, 32, 64])),
    st.tuples(st.sampled_from([100, 200, 300, 400, 800]), st.just(0)),
)
models = st.sampled_from([{}, {"gpumgr.io/gpu-model": "a100"}, {"gpumgr.io/gpu-model-exclude": "A100"}])


@settings(max_examples=300, deadline=None)
@given(ledger=ledgers(), ask=containers, ann=models)
def test_the_quick_verdict_is_the_verdict_of_placing(ledger: Ledger, ask: tuple[int, int], ann: dict[str, str]) -> None:
    a = pod_ask(pod("p", [ask], annotations=ann))
    allowed, never = static_check(MODELS, [16384] * 8, UNIT, a)
    if never is not None:
        return
    quick = quick_check(ledger.cards, allowed, UNIT, a)
    full = place(TOPO, ledger, allowed, UNIT, a)
    assert quick is not None
    assert (quick.ok, quick.unresolvable, quick.reason) == (full.ok, full.unresolvable, full.reason)


@settings(max_examples=300, deadline=None)
@given(ledger=ledgers(), asks=st.lists(containers, min_size=1, max_size=3), ann=models)
def test_a_placement_can_be_assigned_as_chosen(ledger: Ledger, asks: list[tuple[int, int]],
                                               ann: dict[str, str]) -> None:
    a = pod_ask(pod("p", asks, annotations=ann))
    allowed, never = static_check(MODELS, [16384] * 8, UNIT, a)
    if never is not None:
        return
    fit = place(TOPO, ledger, allowed, UNIT, a)
    if not fit.ok:
        assert fit.reason.startswith("container ")
        return
    work = ledger.copy()
    for need, cards in zip(a.containers, fit.cards, strict=True):
        assert all(allowed[c] and ledger.cards[c].healthy for c in cards)
        try:
            work.assign(Allocation(f"p/{need.index}", cards, need.cores, need.memory_units * UNIT))
        except LedgerError as e:  # pragma: no cover - the assertion below reports it
            raise AssertionError(f"placement {fit.cards} over-commits: {e}") from None
