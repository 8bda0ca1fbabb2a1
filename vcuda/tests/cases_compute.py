"""Compute limit on the simulated card: utilisation is what the fake card's
timeline measured, independently of the NVML samples the shim steers by."""

from __future__ import annotations

import subprocess
import time

from harness import UUID_A, UUID_B, Container, Fixture, GiB, Node, finish_load, first_line
from registry import case

WARMUP = 3.0
WINDOW = 10.0
S = 1_000_000_000


def _load(
    c: Container, node: Node, seconds: float, blocks: int = 100, path: str = "kernel", **env: str
) -> tuple[subprocess.Popen[str], int]:
    full = c.env(node)
    full.update(env)
    p = c.spawn("vcload", f"{seconds:.1f}", str(blocks), path, env=full)
    return p, int(first_line(p, "PID").split()[1])


def _finish(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        finish_load(p)


def _single(
    fx: Fixture, target: int, blocks: int = 100, block_ns: int = 10000, sms: int = 80, path: str = "kernel"
) -> float:
    node = fx.node([(UUID_A, 16 * GiB, sms)])
    c = fx.container(f"hard{target}-{sms}-{path}")
    c.write_limits([(UUID_A, 0)], core=target, hard=1)
    t0 = time.monotonic_ns()
    p, pid = _load(c, node, WARMUP + WINDOW + 0.5, blocks, path, FAKEGPU_BLOCK_NS=str(block_ns))
    _finish(p)
    return node.busy(0, t0 + int(WARMUP * S), t0 + int((WARMUP + WINDOW) * S), [pid])


def _hard(target: int) -> None:
    def run(fx: Fixture) -> None:
        util = _single(fx, target)
        fx.figure(f"hard {target:2d}%: achieved {util:5.1f}% over {WINDOW:.0f} s")
        assert abs(util - target) <= 5, f"target {target}%, achieved {util:.1f}%"

    case(f"compute: a hard limit of {target}% holds within 5 points over 10 s", slow=True)(run)


for _t in (10, 30, 50, 70):
    _hard(_t)


@case("compute: two containers at 30% and 70% on one card separate", slow=True)
def pair(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    a, b = fx.container("thirty"), fx.container("seventy")
    a.write_limits([(UUID_A, 0)], core=30)
    b.write_limits([(UUID_A, 0)], core=70)
    t0 = time.monotonic_ns()
    pa, pida = _load(a, node, WARMUP + WINDOW + 0.5)
    pb, pidb = _load(b, node, WARMUP + WINDOW + 0.5)
    _finish(pa, pb)
    w0, w1 = t0 + int(WARMUP * S), t0 + int((WARMUP + WINDOW) * S)
    ua, ub = node.busy(0, w0, w1, [pida]), node.busy(0, w0, w1, [pidb])
    fx.figure(f"pair 30/70 on one card: achieved {ua:5.1f}% / {ub:5.1f}%")
    assert abs(ua - 30) <= 5 and abs(ub - 70) <= 5, f"30/70 became {ua:.1f}/{ub:.1f}"


@case("compute: a soft limit borrows an idle card and gives it back", slow=True)
def soft(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    s, h = fx.container("soft"), fx.container("hard")
    s.write_limits([(UUID_A, 0)], core=30, hard=0, ceiling=0)
    h.write_limits([(UUID_A, 0)], core=60, hard=1)
    t0 = time.monotonic_ns()
    ps, pids = _load(s, node, 20.5)
    time.sleep(7.0)
    ph, pidh = _load(h, node, 13.5)
    _finish(ps, ph)
    alone = node.busy(0, t0 + 2 * S, t0 + 7 * S, [pids])
    shared_s = node.busy(0, t0 + 12 * S, t0 + 20 * S, [pids])
    shared_h = node.busy(0, t0 + 12 * S, t0 + 20 * S, [pidh])
    fx.figure(f"soft 30% alone: borrowed up to {alone:5.1f}%")
    fx.figure(f"soft 30% next to hard 60%: {shared_s:5.1f}% / {shared_h:5.1f}%")
    assert alone >= 80, f"the soft container did not borrow the idle card ({alone:.1f}%)"
    assert shared_s <= 40 and abs(shared_h - 60) <= 5, f"soft/hard became {shared_s:.1f}/{shared_h:.1f}"


@case("compute: the limiter is normalised: 30% on an 8-SM and on a 188-SM card", slow=True)
def normalised(fx: Fixture) -> None:
    # Kernels of 4 blocks per SM lasting 1 ms on both cards.
    small = _single(fx, 30, blocks=32, block_ns=31250, sms=8)
    large = _single(fx, 30, blocks=752, block_ns=1330, sms=188)
    fx.figure(f"hard 30% on 8 SMs: {small:5.1f}%, on 188 SMs: {large:5.1f}%")
    assert abs(small - 30) <= 5 and abs(large - 30) <= 5, f"8 SMs {small:.1f}%, 188 SMs {large:.1f}%"


def _path(path: str) -> None:
    def run(fx: Fixture) -> None:
        util = _single(fx, 30, path=path)
        fx.figure(f"hard 30% through {path}: {util:5.1f}%")
        assert abs(util - 30) <= 5, f"{path}: achieved {util:.1f}%"

    case(f"compute: launches through {path} are limited", slow=True)(run)


for _p in ("ptsz", "ex", "coop", "graph", "getproc"):
    _path(_p)


@case("compute: the share holds for a container of several processes", slow=True)
def processes(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80), (UUID_B, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 0)], core=40)
    t0 = time.monotonic_ns()
    loads = [_load(c, node, WARMUP + WINDOW + 0.5) for _ in range(2)]
    _finish(*(p for p, _ in loads))
    util = node.busy(0, t0 + int(WARMUP * S), t0 + int((WARMUP + WINDOW) * S), [pid for _, pid in loads])
    fx.figure(f"hard 40% shared by 2 processes: {util:5.1f}%")
    assert abs(util - 40) <= 5, f"two processes of a 40% container reached {util:.1f}%"


@case("compute: a launch under the limit makes no system call and no getenv")
def hot_path(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 0)], core=50)
    env = c.env(node)
    env["LD_PRELOAD"] = f"{fx.build / 'libgetenv_count.so'} {fx.build / 'libvcuda.so'}"
    r = c.run("vcsyscall", env=env)
    line = r.line("SYSCALLS")
    assert line == "SYSCALLS 0 GETENV 0 FAILED 0", line + r.err


@case("compute: a new workload does not inherit a burst from the container's last one", slow=True)
def cold_start(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 0)], core=30)
    # Tiny kernels: almost no GPU time, so the limiter learns a very high launch rate.
    p, _ = _load(c, node, 2.0, blocks=1, FAKEGPU_BLOCK_NS="10")
    _finish(p)
    time.sleep(1.5)
    t0 = time.monotonic_ns()
    p, pid = _load(c, node, 4.5)
    _finish(p)
    first = node.busy(0, t0, t0 + 1 * S, [pid])
    rest = node.busy(0, t0 + 1 * S, t0 + 4 * S, [pid])
    fx.figure(f"hard 30% after an idle container: first second {first:5.1f}%, then {rest:5.1f}%")
    assert first <= 35 and abs(rest - 30) <= 5, f"first second {first:.1f}%, then {rest:.1f}%"


@case("compute: kernels of varying length (+-50%) on a card sampled every 167 ms still hold 30%", slow=True)
def jitter(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)], period_ms=167)
    c = fx.container()
    c.write_limits([(UUID_A, 0)], core=30)
    t0 = time.monotonic_ns()
    p, pid = _load(c, node, WARMUP + WINDOW + 0.5, FAKEGPU_JITTER="50")
    _finish(p)
    util = node.busy(0, t0 + int(WARMUP * S), t0 + int((WARMUP + WINDOW) * S), [pid])
    fx.figure(f"hard 30%, kernel lengths +-50%, 167 ms NVML samples: {util:5.1f}%")
    assert abs(util - 30) <= 5, f"achieved {util:.1f}%"
