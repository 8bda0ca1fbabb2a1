"""`make bench` is never silent for long: a line when each bench starts, a heartbeat while it runs, and progress
lines from long loops."""

from __future__ import annotations

import io
import threading
import time

from tests.bench.__main__ import run_one
from tests.bench.stats import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_prints_at_most_every_period_and_at_the_end():
    out = io.StringIO()
    clock = FakeClock()
    p = Progress("packing", total=100, every=10.0, out=out, clock=clock)
    for t in (1.0, 5.0, 9.9, 10.0, 12.0, 19.0, 20.5):
        clock.now = t
        p.tick(10)
    assert out.getvalue().splitlines() == ["  ... packing: 40/100 (40%), 10 s", "  ... packing: 70/100 (70%), 20 s"]
    clock.now = 21.0
    p.finish()
    assert out.getvalue().splitlines()[-1] == "  ... packing: 70/100 (70%), 21 s, done"


def test_progress_without_a_total():
    out = io.StringIO()
    clock = FakeClock()
    p = Progress("rounds", every=1.0, out=out, clock=clock)
    clock.now = 2.0
    p.tick(5)
    assert out.getvalue() == "  ... rounds: 5, 2 s\n"


def test_a_running_bench_has_a_heartbeat_and_a_start_and_end_line():
    out = io.StringIO()
    lock = threading.Lock()

    class Sink:
        def write(self, text: str) -> int:
            with lock:
                return out.write(text)

        def flush(self) -> None:
            pass

    def slow_bench() -> None:  # runs until the heartbeat has spoken at least once (30 s at most)
        deadline = time.monotonic() + 30
        while "still running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)

    run_one("bench_slow", slow_bench, out=Sink(), every=0.02)
    lines = out.getvalue().strip().splitlines()
    assert lines[0].startswith("===== bench_slow")
    assert any("bench_slow still running" in ln for ln in lines[1:-1])
    assert lines[-1].startswith("(bench_slow: ")
