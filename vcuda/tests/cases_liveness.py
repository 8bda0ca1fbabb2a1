"""Which of the container's processes are alive, for giving back memory: processes in another PID namespace
(containers of one pod or one DRA claim share /dev/shm but not PIDs) and processes whose main thread has ended
are alive; a killed one is not."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from harness import UUID_A, Container, Fixture, GiB, MiB, Node, first_line, stop
from registry import case


def _filled(c: Container, node: Node) -> int:
    return int(c.run("vcmem", "fill", env=c.env(node)).ok().line("FILLED").split()[1])


def _main_thread_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@case("memory: a process in another PID namespace sharing the directory keeps its memory counted")
def other_pid_namespace(fx: Fixture) -> None:
    unshare = shutil.which("unshare")
    assert unshare, "this test needs unshare(1) (util-linux) and root to make a PID namespace"
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = c.env(node)
    holder = subprocess.Popen(
        [unshare, "-p", "-f", "-m", "--mount-proc", "--kill-child", str(fx.build / "vcmem"), "hold",
         str(600 * MiB)],
        env=env, cwd=c.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert first_line(holder, "HOLD") == "HOLD 0"
        filled = _filled(c, node)
        assert filled == 424 * MiB, f"next to a 600 MiB holder in another PID namespace {filled >> 20} MiB of " \
                                    "1024 could be allocated"
        # The periodic sweep (every second) must not take it either.
        p = c.spawn("vcmem", "hold", str(1 * MiB), env=env)
        try:
            assert first_line(p, "HOLD") == "HOLD 0"
            time.sleep(2.5)
        finally:
            stop(p)
        filled = _filled(c, node)
        assert filled == 424 * MiB, f"after a sweep, {filled >> 20} MiB of 1024 could be allocated"
    finally:
        stop(holder)
    # unshare's child in the namespace dies after unshare itself (--kill-child): wait for the memory to come back
    # rather than for a fixed time (0.2 s was not always enough on a loaded machine)
    deadline = time.monotonic() + 30
    while (filled := _filled(c, node)) != 1 * GiB and time.monotonic() < deadline:
        time.sleep(0.2)
    assert filled == 1 * GiB, f"the holder is gone, yet only {filled >> 20} MiB of 1024 could be allocated"


@case("memory: a process whose main thread ended (pthread_exit) but whose other threads run keeps its memory")
def main_thread_exited(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = c.env(node)
    holder = c.spawn("vcmem", "hold-thread", str(600 * MiB), env=env)
    try:
        assert first_line(holder, "HOLD") == "HOLD 0"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _main_thread_state(holder.pid) != "Z":
            time.sleep(0.01)
        assert _main_thread_state(holder.pid) == "Z", "the main thread did not end"
        filled = _filled(c, node)
        assert filled == 424 * MiB, f"next to a live process whose main thread ended, {filled >> 20} MiB of " \
                                    "1024 could be allocated"
        # The fake driver (the test's oracle) must not free its memory either.
        assert node.pool_used() >= 600 * MiB + 424 * MiB, f"the fake driver's pool holds {node.pool_used() >> 20} MiB"
    finally:
        stop(holder)


@case("memory: a process that closes descriptors it did not open (as daemons do) keeps its memory counted")
def closes_descriptors(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = c.env(node)
    holder = c.spawn("vcmem", "hold-closefds", str(600 * MiB), env=env)
    try:
        assert first_line(holder, "HOLD") == "HOLD 0"
        first_line(holder, "CLOSED")
        filled = _filled(c, node)
        assert filled == 424 * MiB, f"next to a holder that closed its descriptors, {filled >> 20} MiB of 1024 " \
                                    "could be allocated"
    finally:
        stop(holder)


@case("memory: a killed process's memory comes back even while a child it forked lives on")
def parent_killed_child_lives(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = c.env(node)
    holder = c.spawn("vcmem", "hold-fork", str(600 * MiB), env=env)
    child = 0
    try:
        assert first_line(holder, "HOLD") == "HOLD 0"
        child = int(first_line(holder, "CHILD").split()[1])
        holder.kill()
        holder.wait(timeout=10)
        filled = _filled(c, node)
        assert filled == 1 * GiB, f"after the holder was killed (its child, which never used CUDA, lives on), " \
                                  f"{filled >> 20} MiB of 1024 could be allocated"
    finally:
        stop(holder)
        if child:
            subprocess.run(["kill", "-9", str(child)], check=False)
