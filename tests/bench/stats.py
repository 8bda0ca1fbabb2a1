"""Percentiles for the benchmarks, and progress lines so that a long bench is never silent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def summary_ms(samples_s: list[float]) -> str:
    ms = [x * 1000 for x in samples_s]
    return f"p50 {pct(ms, 50):.3f} ms, p99 {pct(ms, 99):.3f} ms, max {max(ms):.3f} ms (n={len(ms)})"


class Progress:
    """`tick()` in a long loop prints `  ... label: done/total (pct%), elapsed` at most once per `every` seconds.

        p = Progress("packing", total=len(seeds))
        for s in seeds:
            ...
            p.tick()
    """

    def __init__(self, label: str, total: int | None = None, every: float = 10.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.total = total
        self.every = every
        self.out = out
        self.clock = clock
        self.done = 0
        self.start = clock()
        self._next = self.start + every

    def tick(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now >= self._next:
            self._print(now)
            self._next = now + self.every

    def finish(self) -> None:
        """A last line, only when the loop was long enough to print progress at all."""
        now = self.clock()
        if now - self.start >= self.every:
            self._print(now, ", done")

    def _print(self, now: float, tail: str = "") -> None:
        count = f"{self.done}/{self.total} ({100 * self.done // max(1, self.total)}%)" if self.total else str(self.done)
        out = self.out or sys.stdout
        out.write(f"  ... {self.label}: {count}, {now - self.start:.0f} s{tail}\n")
        out.flush()
