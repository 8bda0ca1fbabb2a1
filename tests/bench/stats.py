"""Percentiles for the benchmarks."""

from __future__ import annotations


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def summary_ms(samples_s: list[float]) -> str:
    ms = [x * 1000 for x in samples_s]
    return f"p50 {pct(ms, 50):.3f} ms, p99 {pct(ms, 99):.3f} ms, max {max(ms):.3f} ms (n={len(ms)})"
