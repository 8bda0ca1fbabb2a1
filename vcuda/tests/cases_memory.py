"""Memory limit: every allocation path, across processes, and what the
container is told about memory."""

from __future__ import annotations

import json
import os
import random
import signal
import time

from harness import UUID_A, UUID_B, UUID_C, Fixture, GiB, MiB, fields, first_line, stop
from registry import case


@case("memory: every allocation path is counted at its real size, capped, and given back")
def every_path(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    r = c.run("vcmem", "paths", env=c.env(node)).ok()
    assert r.out.count("PASS") == 9, r.out


@case("memory: cuMemGetInfo, cuDeviceTotalMem and NVML (v1 and v2) agree")
def info_agrees(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = c.env(node)
    holder = c.spawn("vcmem", "hold", str(300 * MiB), env=env)
    try:
        assert first_line(holder, "HOLD") == "HOLD 0"
        i = fields(c.run("vcmem", "info", env=env).ok().line("INFO"))
    finally:
        stop(holder)
    assert i["cuda_total"] == i["devtotal"] == i["nvml_total"] == i["nvml2_total"] == 1 * GiB, i
    assert i["cuda_free"] == i["nvml_free"] == i["nvml2_free"] == 1 * GiB - 300 * MiB, i
    assert i["nvml_used"] == i["nvml2_used"] == 300 * MiB, i
    assert i["cuda32_total"] == 1 * GiB and i["devtotal32"] == 1 * GiB, i
    # A limit above the card: total is the card, free never more than physically free.
    node2 = fx.node([(UUID_A, 2 * GiB, 80)])
    c2 = fx.container("big")
    c2.write_limits([(UUID_A, 64 * GiB)])
    i2 = fields(c2.run("vcmem", "info", env=c2.env(node2)).ok().line("INFO"))
    assert i2["cuda_total"] == i2["nvml_total"] == i2["devtotal"] == 2 * GiB, i2


@case("memory: NVML through pynvml (dlopen + dlsym, as nvidia-smi and Python tools do)")
def pynvml_view(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 3 * GiB)])
    code = (
        "import json, pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "m = pynvml.nvmlDeviceGetMemoryInfo(h)\n"
        "m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)\n"
        "print(json.dumps([m.total, m.free, m.used, m2.total, m2.free]))\n"
    )
    r = c.run(os.environ["VCTEST_PYTHON"], "-c", code, env=c.env(node))
    assert r.rc == 0, r.err
    total, free, used, total2, free2 = json.loads(r.lines[-1])
    assert total == total2 == 3 * GiB and free == free2 == 3 * GiB and used == 0, r.out


@case("memory: 4 processes racing for one limit never overshoot it")
def race(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    limit, chunk = 1 * GiB, 6 * MiB
    c.write_limits([(UUID_A, limit)])
    env = c.env(node)
    for rnd in range(3):
        start, release = fx.path(f"start{rnd}"), fx.path(f"release{rnd}")
        procs = [c.spawn("vcmem", "race", str(chunk // MiB), str(start), str(release), env=env) for _ in range(4)]
        try:
            time.sleep(0.3)
            start.touch()
            held = [int(first_line(p, "HELD").split()[1]) for p in procs]
            used = node.pool_used()
        finally:
            release.touch()
            for p in procs:
                p.wait(timeout=30)
        total = sum(held)
        assert total <= limit, f"round {rnd}: the container holds {total} bytes over a {limit} limit"
        assert total > limit - chunk, f"round {rnd}: only {total} of {limit} bytes could be allocated"
        assert used == total, f"round {rnd}: the card has {used} bytes in use, the processes report {total}"
    fx.figure(f"race: 4 processes x 3 rounds, limit {limit >> 20} MiB, held {total >> 20} MiB at most")


@case("memory: a killed process's memory is given back and the lock is never left held", alone=True)
def dead_processes(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = c.env(node)
    holder = c.spawn("vcmem", "hold", str(600 * MiB), env=env)
    assert first_line(holder, "HOLD") == "HOLD 0"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    filled = int(c.run("vcmem", "fill", env=env).ok().line("FILLED").split()[1])
    assert filled == 1 * GiB, f"after the holder died only {filled} bytes could be allocated"
    # Kill processes while they allocate and free as fast as they can.
    rng = random.Random(4)
    for _ in range(12):
        procs = [c.spawn("vcmem", "churn", env=env) for _ in range(3)]
        for p in procs:
            first_line(p, "CHURNING")
        time.sleep(rng.uniform(0.01, 0.2))
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
    filled = int(c.run("vcmem", "fill", env=env, timeout=30).ok().line("FILLED").split()[1])
    assert filled == 1 * GiB, f"after 36 killed processes only {filled} bytes could be allocated"


@case("memory: frees of handles the shim never saw reach the driver unchanged")
def unknown_frees(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    c.run("vcmem", "unknown", env=c.env(node)).ok()


@case("memory: a real out-of-memory gives the reservation back")
def rollback(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 2 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 32 * GiB)])
    c.run("vcmem", "rollback", env=c.env(node)).ok()


@case("memory: context memory (seen through NVML) counts against the limit")
def contexts(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)], ctx_bytes=256 * MiB)
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    c.run("vcmem", "ctx", str(256 * MiB), env=c.env(node), timeout=30).ok()


@case("memory: several GPUs, CUDA_VISIBLE_DEVICES by index and by UUID")
def several_devices(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80), (UUID_B, 16 * GiB, 80), (UUID_C, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB), (UUID_C, 2 * GiB)])
    for visible in ("2,0", f"{UUID_C},{UUID_A}"):
        r = c.run("vcmem", "devices", env=c.env(node, CUDA_VISIBLE_DEVICES=visible)).ok()
        assert r.line("COUNT") == "COUNT 2", r.out
        d0, d1 = r.line("DEV 0").split(), r.line("DEV 1").split()
        assert d0[2] == UUID_C and d0[3] == f"total={2 * GiB}" and d0[4:] == ["over=2", "fits=0"], r.out
        assert d1[2] == UUID_A and d1[3] == f"total={1 * GiB}" and d1[4:] == ["over=2", "fits=0"], r.out
    # A device the limits do not name gets no memory at all (fail closed), not the whole card.
    r = c.run("vcmem", "devices", env=c.env(node, CUDA_VISIBLE_DEVICES="1"))
    assert r.line("DEV 0").split()[2:5] == [UUID_B, "total=0", "over=2"], r.out


@case("memory: a whole-card container has no cap and no throttling")
def whole_card(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 4 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 0)], core=0)
    env = c.env(node)
    i = fields(c.run("vcmem", "info", env=env).ok().line("INFO"))
    assert i["cuda_total"] == i["nvml_total"] == 4 * GiB, i
    filled = int(c.run("vcmem", "fill", env=env).ok().line("FILLED").split()[1])
    assert filled == 4 * GiB, filled
    t0 = time.monotonic_ns()
    p = c.spawn("vcload", "4", "100", "kernel", env=env)
    pid = int(first_line(p, "PID").split()[1])
    p.wait(timeout=30)
    util = node.busy(0, t0 + 1_000_000_000, t0 + 4_000_000_000, [pid])
    assert util > 90, f"a whole-card container reached only {util:.1f}%"
    fx.figure(f"whole card (no limit): {util:.1f}%")
