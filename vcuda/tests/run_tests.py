#!/usr/bin/env python3
"""Runs every test of the vCUDA shim against the fake GPU and prints one
closing line "N passed, M failed". Long compute tests run concurrently (each
on its own simulated card), a few at a time (3 per CPU, at least 4: a compute
case is mostly waiting, but its limiter and load must be scheduled on time),
next to the short cases (3 at a time); cases that burst CPU work (hundreds of
processes, busy loops) run afterwards, one at a time, so that they cannot starve
a compute case's measurement. The suite takes about a minute.

    python run_tests.py --build ../build [-k substring] [-j slow-workers]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))  # the repository, for gpumgr.pb

import cases_attribution  # noqa: E402,F401  (registers its cases)
import cases_compute  # noqa: E402,F401
import cases_crowd  # noqa: E402,F401
import cases_fork  # noqa: E402,F401
import cases_hardening  # noqa: E402,F401
import cases_identity  # noqa: E402,F401
import cases_liveness  # noqa: E402,F401
import cases_memory  # noqa: E402,F401
import cases_mig  # noqa: E402,F401
import cases_procaddr  # noqa: E402,F401
from harness import Fixture  # noqa: E402
from registry import CASES, Case  # noqa: E402


def run_case(c: Case, build: Path, root: Path, idx: int) -> tuple[Case, bool, float, str, list[str]]:
    tmp = Path(tempfile.mkdtemp(prefix=f"c{idx}-", dir=root))
    fx = Fixture(build, tmp, c.title)
    start = time.monotonic()
    try:
        c.fn(fx)
        ok, why = True, ""
    except AssertionError as e:
        ok, why = False, str(e) or traceback.format_exc()
    except Exception:  # a broken test is a failed test
        ok, why = False, traceback.format_exc()
    return c, ok, time.monotonic() - start, why, fx.figures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(HERE.parent / "build"))
    ap.add_argument("-k", default="", help="run only cases whose title contains this")
    ap.add_argument("-j", type=int, default=0, help="slow cases at once (default: 3 per CPU, at least 4)")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    os.environ.setdefault("VCTEST_PYTHON", sys.executable)
    cases = [c for c in CASES if args.k in c.title]
    cases.sort(key=lambda c: not c.slow)  # report the long ones first
    slow_workers = args.j or max(4, 3 * (os.cpu_count() or 1))
    # Short paths: unix socket names are limited to 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="vcuda-test-", dir="/tmp"))
    passed = failed = 0
    figures: list[str] = []
    t0 = time.monotonic()

    def report(result: tuple[Case, bool, float, str, list[str]]) -> None:
        nonlocal passed, failed
        c, ok, secs, why, figs = result
        figures.extend(figs)
        if ok:
            passed += 1
            print(f"PASS {c.title} ({secs:.1f}s)", flush=True)
        else:
            failed += 1
            print(f"FAIL {c.title} ({secs:.1f}s)\n    " + why.replace("\n", "\n    "), flush=True)

    try:
        with ThreadPoolExecutor(max_workers=max(1, slow_workers)) as slow, ThreadPoolExecutor(max_workers=3) as fast:
            futures = [(slow if c.slow else fast).submit(run_case, c, build, root, i)
                       for i, c in enumerate(cases) if not c.alone]
            for f in futures:
                report(f.result())
        for i, c in enumerate(cases):  # CPU bursts: after the others, one at a time
            if c.alone:
                report(run_case(c, build, root, i))
    finally:
        if failed == 0:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"(test directories kept in {root})")
    if figures:
        print("\nMeasured figures (fake card, utilisation from its timeline):")
        for fig in figures:
            print("  " + fig)
    print(f"\n(total {time.monotonic() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
