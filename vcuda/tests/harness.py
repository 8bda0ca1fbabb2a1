"""Environment for the shim's tests: a simulated GPU node, per-container
directories (limits file, vDevice socket, shared state), and helpers that run
the test programs with libvcuda in front of the fake driver."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20

UUID_A = "GPU-11111111-2222-3333-4444-00000000000a"
UUID_B = "GPU-11111111-2222-3333-4444-00000000000b"
UUID_C = "GPU-11111111-2222-3333-4444-00000000000c"


class Fixture:
    """Everything one test case needs, under its own temporary directory."""

    def __init__(self, build: Path, tmp: Path, name: str) -> None:
        self.build = build
        self.tmp = tmp
        self.name = name
        self.figures: list[str] = []
        self._n = 0

    def path(self, name: str) -> Path:
        return self.tmp / name

    def node(self, devices: list[tuple[str, int, int]], period_ms: int = 50, ctx_bytes: int = 0) -> Node:
        self._n += 1
        state = self.tmp / f"node{self._n}.state"
        spec = ";".join(f"{u}:{size}:{sms}" for u, size, sms in devices)
        subprocess.run(
            [str(self.build / "fakegpu"), "init", str(state), spec, str(period_ms), str(ctx_bytes), "13000"],
            check=True,
            timeout=10,
        )
        return Node(self, state)

    def container(self, name: str = "c") -> Container:
        d = self.tmp / name
        (d / "etc").mkdir(parents=True, exist_ok=True)
        (d / "shm").mkdir(exist_ok=True)
        return Container(self, d)

    def figure(self, text: str) -> None:
        self.figures.append(text)


class Node:
    def __init__(self, fx: Fixture, state: Path) -> None:
        self.fx = fx
        self.state = state

    def busy(self, dev: int, t0: int, t1: int, pids: list[int]) -> float:
        """Percent of [t0, t1) (CLOCK_MONOTONIC ns) the pids held device dev's timeline."""
        out = subprocess.run(
            [str(self.fx.build / "fakegpu"), "busy", str(self.state), str(dev), str(t0), str(t1)]
            + [str(p) for p in pids],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return float(out.stdout.strip())

    def pool_used(self, dev: int = 0) -> int:
        out = subprocess.run(
            [str(self.fx.build / "fakegpu"), "used", str(self.state), str(dev)],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return int(out.stdout.strip())


class Container:
    """One container's view: its /etc/vcuda equivalent and shared directory."""

    def __init__(self, fx: Fixture, root: Path) -> None:
        self.fx = fx
        self.root = root
        self.limits = root / "etc" / "limits"
        self.socket = root / "etc" / "vcuda.sock"
        self.shm = root / "shm"

    def write_limits(
        self,
        devices: list[tuple[str, int]],
        core: int = 0,
        hard: int = 1,
        ceiling: int = 0,
        extra: str = "",
    ) -> None:
        lines = [
            "# written by the test",
            "version=1",
            "pod_uid=0b7c5d2e-1111-2222-3333-444455556666",
            "container_name=main",
            f"core_limit={core}",
            f"hard_limit={hard}",
            f"core_ceiling={ceiling}",
            f"device_count={len(devices)}",
        ]
        for i, (uuid, mem) in enumerate(devices):
            if uuid:
                lines.append(f"device{i}_uuid={uuid}")
            lines.append(f"device{i}_index={i}")
            lines.append(f"device{i}_memory_limit={mem}")
        self.limits.write_text("\n".join(lines) + "\n" + extra)

    def env(self, node: Node | None, preload: bool = True, **extra: str) -> dict[str, str]:
        b = self.fx.build
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(b / "fake"),
            "VCUDA_LIMITS": str(self.limits),
            "VCUDA_SOCKET": str(self.socket),
            "VCUDA_SHARED_DIR": str(self.shm),
            "VCUDA_LOG_LEVEL": "2",
            "FAKEGPU_BLOCK_NS": "10000",
            "VCTEST_SHIM": str(b / "libvcuda.so"),
            "VCTEST_FAKE": str(b / "fake" / "libcuda.so.1"),
        }
        if node is not None:
            env["FAKEGPU_STATE"] = str(node.state)
        if preload:
            env["LD_PRELOAD"] = str(b / "libvcuda.so")
        env.update(extra)
        return env

    def run(self, prog: str, *args: str, env: dict[str, str], timeout: float = 60) -> Result:
        return run(self.fx.build, prog, list(args), env, timeout, cwd=self.root)

    def spawn(self, prog: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.fx.build / prog), *args],
            env=env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def run(build: Path, prog: str, args: list[str], env: dict[str, str], timeout: float, cwd: Path) -> Result:
    exe = prog if prog.startswith("/") else str(build / prog)
    try:
        p = subprocess.run([exe, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{prog} {' '.join(args)} did not finish within {timeout}s") from e
    return Result(p.returncode, p.stdout, p.stderr)


def first_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 15, stream: str = "stdout",
               contains: bool = False) -> str:
    """Read lines of proc's stdout (or stderr) until one starts with prefix (or, with contains, holds it anywhere);
    bounded by the process ending and by timeout."""
    out = proc.stdout if stream == "stdout" else proc.stderr
    assert out is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = out.readline()
        if not line:
            rest = proc.stderr.read() if proc.stderr is not None and stream == "stdout" else ""
            raise AssertionError(f"process ended before writing {prefix!r} on {stream}: {rest}")
        if (prefix in line) if contains else line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix!r} line on {stream} within {timeout}s")


def finish_load(p: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait (60 s at most) for a load program to end and check that it passed; its (stdout, stderr)."""
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("a load did not finish") from None
    assert p.returncode == 0 and "FAIL" not in out, out + err
    return out, err


def status_of(c: Container) -> dict[str, str]:
    """The key=value lines of the container's one shim status file."""
    files = sorted(c.shm.glob("vcuda-*.status"))
    assert len(files) == 1, f"expected one status file in {c.shm}, found {files}"
    out = {}
    for ln in files[0].read_text().splitlines():
        k, _, v = ln.partition("=")
        out[k] = v
    return out


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def fields(line: str) -> dict[str, int]:
    """'INFO a=1 b=2' -> {'a': 1, 'b': 2}"""
    out = {}
    for tok in line.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = int(v)
    return out


@dataclass
class Result:
    rc: int
    out: str
    err: str
    lines: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.lines = self.out.splitlines()

    def line(self, prefix: str) -> str:
        for ln in self.lines:
            if ln.startswith(prefix):
                return ln
        raise AssertionError(f"no line starting {prefix!r} in output:\n{self.out}\n{self.err}")

    def ok(self) -> Result:
        assert self.rc == 0 and "FAIL" not in self.out, f"exit {self.rc}\n{self.out}\n{self.err}"
        return self
