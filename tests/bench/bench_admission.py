"""Admission property run at scale: many random cases (pods, admission orders, extender records, memory pressure)
through the kubelet emulator and the agent; prints how many cases and admissions ran, how many pods were
stranded, and how often the agent refused an admission as unsafe (see tests/admission/scenario.py)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from tests.admission.scenario import Totals, make_case, run_case
from tests.e2e.harness import sim_node

CONFIGS = [("gtx1080ti", 4096, 10_000, 400), ("a10-4x", 8192, 20_000, 400), ("dgx-a100", 16384, 30_000, 150)]


async def run(cases_scale: float = 1.0) -> int:
    failed = 0
    for topo, memory_mib, first, count in CONFIGS:
        totals = Totals()
        t0 = time.perf_counter()
        async with sim_node(topo, memory_mib=memory_mib) as node:
            card_units = memory_mib // node.agent.state.memory_unit_mib
            for seed in range(first, first + int(count * cases_scale)):
                await run_case(node, make_case(seed, len(node.inventory.gpus), card_units), totals)
        took = time.perf_counter() - t0
        print(f"admission property, {topo} ({memory_mib} MiB cards): {totals.summary()}; {took:.1f} s", flush=True)
        for line in (totals.stranded_cases + totals.violation_lines)[:20]:
            print(f"  {line}")
        for line in totals.refusal_lines[:5]:
            print(f"  refused as unsafe: {line}")
        failed += totals.stranded + totals.violations + totals.refusals_following
    return failed


def main() -> None:
    logging.getLogger("gpumgr").setLevel(logging.CRITICAL)  # repaired guesses and refusals are expected here
    scale = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].replace(".", "").isdigit() else 1.0
    bad = asyncio.run(run(scale))
    print(f"admission property: {'no stranded pod, no violation' if not bad else f'{bad} failures'}")


if __name__ == "__main__":
    main()
