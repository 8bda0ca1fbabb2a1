"""A forked worker is a new process of the container: its own host PID (learnt again after the fork, whatever the
parent had initialised), its own slot, its own share of the compute limit; the parent keeps its own. Both builds:
LD_PRELOAD and installed as libcuda.so.1 / libnvidia-ml.so.1."""

from __future__ import annotations

import subprocess
import time

from cases_procaddr import dropin_env
from harness import UUID_A, Container, Fixture, GiB, MiB, Node, stop
from registry import case
from vdevice_server import Reply, VDeviceTestServer

S = 1_000_000_000
BUILDS = ("preload", "drop-in")
CTX = 64 * MiB


def _env(fx: Fixture, c: Container, node: Node, build: str, **extra: str) -> dict[str, str]:
    env = c.env(node, **extra) if build == "preload" else dropin_env(fx, c, node, explicit=True)
    env.update(extra)
    return env


def _lines(p: subprocess.Popen[str], until: str, timeout: float = 60) -> dict[str, str]:
    """Read the program's KEY value lines until `until`; a FAIL line fails the test."""
    assert p.stdout is not None
    out: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            err = p.stderr.read() if p.stderr else ""
            raise AssertionError(f"vcfork ended before {until!r}: {out}\n{err}")
        key, _, value = line.strip().partition(" ")
        assert key != "FAIL", line + str(out)
        out[key] = value
        if key == until:
            return out
    raise AssertionError(f"no {until!r} within {timeout}s: {out}")


def _filled(c: Container, env: dict[str, str]) -> int:
    return int(c.run("vcmem", "fill", env=env, timeout=60).ok().line("FILLED").split()[1])


def _compute(build: str) -> None:
    def run(fx: Fixture) -> None:
        node = fx.node([(UUID_A, 16 * GiB, 80)])
        c = fx.container()
        reply = Reply(devices=[(UUID_A, 0, 1 * GiB)], core_limit=30, hard_limit=True)  # host PID = the asker's
        with VDeviceTestServer(str(c.socket), reply) as srv:
            env = _env(fx, c, node, build)
            t0 = time.monotonic_ns()
            p = subprocess.Popen([str(fx.build / "vcfork"), "nvml", "exit", "6.5"], env=env, cwd=c.root,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                out = _lines(p, "HOLDING")
            finally:
                stop(p)
            asked = sorted({r.pid for r in srv.requests})
        parent, child = int(out["PARENT"]), int(out["CHILD"])
        err = p.stderr.read() if p.stderr else ""
        assert out["CHILD_INIT"] == "0" and out["CHILD_ALLOC"] == "0", f"{out}\n{err}"
        util = node.busy(0, t0 + 2 * S, t0 + 6 * S, [child])
        fx.figure(f"hard 30%, worker forked after its parent used NVML ({build}): {util:5.1f}%")
        assert child in asked, f"the worker ({child}) never asked the vDevice server for its host PID: {asked}"
        assert 15 <= util <= 45, f"a hard-30% worker forked after its parent ({parent}) used NVML got {util:.1f}% " \
                                 f"of the card ({build})\n{err}"
        status = [f.read_text() for f in c.shm.glob("vcuda-*.status")]
        assert not any("device0_compute=device" in s for s in status), \
            f"the worker's own use was not seen by NVML (measured from the card instead): {status}\n{err}"

    case(f"fork: a worker forked after its parent used NVML is limited as its own process ({build})", slow=True)(run)


for _b in BUILDS:
    _compute(_b)


def _accounting(build: str) -> None:
    def run(fx: Fixture) -> None:
        for mode in ("nvml", "init", "alloc"):
            # Contexts cost memory (seen through NVML, by host PID) only where the parent has none to muddle it.
            ctx = CTX if mode == "nvml" else 0
            node = fx.node([(UUID_A, 16 * GiB, 80)], ctx_bytes=ctx)
            for end in ("exit", "_exit"):
                c = fx.container(f"{mode}{end}")
                c.write_limits([(UUID_A, 1 * GiB)])
                env = _env(fx, c, node, build, VCUDA_LOG_LEVEL="3")
                what = f"{build}, parent {mode}, worker ends with {end}()"
                p = c.spawn("vcfork", mode, end, "0", str(ctx), env=env)
                try:
                    out = _lines(p, "HOLDING")
                    parent, child = int(out["PARENT"]), int(out["CHILD"])
                    held = 256 * MiB if mode == "alloc" else 0
                    assert out["CHILD_EXIT"] == "0", (what, out)
                    if mode == "nvml":
                        # CUDA was not initialised before the fork: the worker is a CUDA process of its own.
                        assert out["CHILD_INIT"] == "0" and out["CHILD_ALLOC"] == "0", (what, out)
                        # Its context is found in NVML's list under its own host PID and counts.
                        assert int(out["CHILD_USED"]) == 128 * MiB + CTX, f"{what}: the worker's 128 MiB and " \
                            f"its {CTX >> 20} MiB context count {int(out['CHILD_USED']) >> 20} MiB"
                    else:
                        # CUDA does not carry over a fork (the driver refuses it); NVML still tells the container's use.
                        assert out["CHILD_INIT"] == "3", (what, out)
                        assert int(out["CHILD_NVML_USED"]) == held, (what, out)
                        assert out["PARENT_ALLOC"] == "0" and int(out["PARENT_USED"]) == held, (what, out)
                    # The worker is gone: its memory is back, the parent's still counts.
                    filled = _filled(c, env)
                    assert filled == 1 * GiB - held, f"{what}: {filled >> 20} MiB of 1024 could be allocated " \
                                                     f"next to a parent holding {held >> 20} MiB"
                finally:
                    stop(p)
                err = p.stderr.read() if p.stderr else ""
                # Each process used its own host PID (the limits file has none; this is the host's PID namespace).
                for pid in (parent, child):
                    said = [ln for ln in err.splitlines() if ln.startswith(f"vcuda[{pid}] info: limits from")]
                    assert all(f"host_pid={pid}" in ln for ln in said), f"{what}: {said}"
                    if pid == child or mode != "nvml":
                        assert said, f"{what}: process {pid} did not load its limits\n{err}"
                filled = _filled(c, env)
                assert filled == 1 * GiB, f"{what}: after the parent was killed {filled >> 20} MiB of 1024 " \
                                          "could be allocated"

    case(f"fork: a worker forked after NVML, cuInit or allocations has its own slot and host PID; exit and _exit "
         f"({build})")(run)


for _b in BUILDS:
    _accounting(_b)
