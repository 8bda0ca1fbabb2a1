"""Compute-limit figures for `make bench` that the test suite only bounds loosely: the limiter when NVML has no
per-process utilisation (device mode), alone and next to another container, and how fast a limited container
ramps up before NVML has samples. Utilisation is the fake card's own timeline. Prints; asserts nothing."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from harness import UUID_A, Container, Fixture, GiB, MiB, Node, first_line

S = 1_000_000_000
WARMUP, WINDOW = 3.0, 10.0
NO_PROC = {"FAKEGPU_NVML_PROC_UTIL": "unsupported"}


def _load(c: Container, node: Node, seconds: float, blocks: int = 100, **env: str) -> tuple[subprocess.Popen[str], int]:
    full = c.env(node)
    full.update(env)
    p = c.spawn("vcload", f"{seconds:.1f}", str(blocks), "kernel", env=full)
    return p, int(first_line(p, "PID").split()[1])


def _launches(p: subprocess.Popen[str]) -> int:
    out, err = p.communicate(timeout=120)
    if p.returncode != 0:
        raise RuntimeError(out + err)
    return int(out.split("LAUNCHES")[1].split()[0])


def device_mode_alone(fx: Fixture, target: int, period_ms: int = 50) -> str:
    node = fx.node([(UUID_A, 16 * GiB, 80)], period_ms=period_ms, ctx_bytes=64 * MiB)
    c = fx.container(f"dev{target}")
    c.write_limits([(UUID_A, 0)], core=target)
    t0 = time.monotonic_ns()
    p, pid = _load(c, node, WARMUP + WINDOW + 0.5, **NO_PROC)
    _launches(p)
    util = node.busy(0, t0 + int(WARMUP * S), t0 + int((WARMUP + WINDOW) * S), [pid])
    return f"device mode (no per-process NVML), hard {target:2d}% alone, NVML period {period_ms} ms: {util:5.1f}%"


def device_mode_shared(fx: Fixture) -> str:
    node = fx.node([(UUID_A, 16 * GiB, 80)], ctx_bytes=64 * MiB)
    lim, other = fx.container("lim"), fx.container("other")
    lim.write_limits([(UUID_A, 0)], core=50)
    other.write_limits([(UUID_A, 0)], core=0)
    t0 = time.monotonic_ns()
    pl, pidl = _load(lim, node, 18.5, **NO_PROC)
    time.sleep(5.0)  # alone first: the limiter learns what its launches cost
    po, pido = _load(other, node, 13.0, **NO_PROC)
    _launches(pl)
    _launches(po)
    alone = node.busy(0, t0 + 2 * S, t0 + 5 * S, [pidl])
    ul = node.busy(0, t0 + 8 * S, t0 + 18 * S, [pidl])
    uo = node.busy(0, t0 + 8 * S, t0 + 18 * S, [pido])
    return (f"device mode, hard 50% alone {alone:5.1f}%, then next to an unlimited container: "
            f"{ul:5.1f}% / {uo:5.1f}%")


def ramp(fx: Fixture, block_ns: int, tag: str) -> str:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    lim, unl = fx.container(f"ramp{tag}"), fx.container(f"unl{tag}")
    lim.write_limits([(UUID_A, 0)], core=50)
    unl.write_limits([(UUID_A, 0)], core=0)
    out = []
    for secs in (0.2, 1.0):
        nl = _launches(_load(lim, node, secs, blocks=1, FAKEGPU_BLOCK_NS=str(block_ns))[0])
        nu = _launches(_load(unl, node, secs, blocks=1, FAKEGPU_BLOCK_NS=str(block_ns))[0])
        out.append(f"first {secs:.1f} s: {nl} limited / {nu} unlimited launches")
        time.sleep(1.2)  # let the container's limiter go stale: each run starts cold
    return f"hard 50%, {tag} kernels, from a cold start: " + "; ".join(out)


def run(fx_for: Callable[[str], Fixture]) -> None:
    jobs: list[tuple[str, Callable[[], str]]] = [
        (f"alone{t}", (lambda t=t: device_mode_alone(fx_for(f"alone{t}"), t))) for t in (10, 30, 50, 70)
    ]
    for period in (400, 1000):
        jobs.append((f"slow{period}", (lambda p=period: device_mode_alone(fx_for(f"slow{p}"), 30, p))))
    jobs.append(("shared", lambda: device_mode_shared(fx_for("shared"))))
    jobs.append(("ramp10us", lambda: ramp(fx_for("ramp10us"), 10000, "10 us")))
    jobs.append(("ramp10ns", lambda: ramp(fx_for("ramp10ns"), 10, "10 ns (free)")))
    print("\ncompute limiter (fake card, utilisation from its timeline, 10 s after a 3 s warm-up):")
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(fn) for _, fn in jobs]
        for f in futures:
            print("  " + f.result(), flush=True)
