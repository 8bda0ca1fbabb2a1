"""Property test of admission: random pods, random admission orders, with and without extender records, under
memory pressure; no pod that fits is stranded and every invariant holds (see scenario.py). Many more cases run
under `make bench` (tests/bench/bench_admission.py)."""

from __future__ import annotations

import pytest

from tests.admission.scenario import Totals, make_case, run_case
from tests.e2e.harness import sim_node

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize(("topo", "memory_mib", "seeds"), [
    ("gtx1080ti", 4096, range(0, 20)),  # 2 cards of 16 units: memory runs out before cores
    ("a10-4x", 8192, range(100, 115)),  # 4 cards of 32 units
    ("dgx-a100", 16384, range(212, 229)),  # 8 cards; some cases' kubelet ignores the preferred cards
])
async def test_random_admissions_strand_nothing_and_keep_every_invariant(topo, memory_mib, seeds):
    totals = Totals()
    async with sim_node(topo, memory_mib=memory_mib) as node:
        for seed in seeds:
            card_units = memory_mib // node.agent.state.memory_unit_mib
            await run_case(node, make_case(seed, len(node.inventory.gpus), card_units), totals)
        print(totals.summary())
        assert node.agent.state.ledger.allocations == {}
    assert totals.stranded == 0, "\n".join(totals.stranded_cases)
    assert totals.violations == 0, "\n".join(totals.violation_lines)
    assert totals.refusals_following == 0, "\n".join(totals.refusal_lines)
    assert totals.started > totals.cases  # the cases did run pods
    if topo == "dgx-a100":  # these seeds include kubelets that ignore the preferred cards: refused, then recreated
        assert totals.refusals > 0
