"""A gpumgr process under attack, held to the chart's memory limit for its component.

`Capped.start` runs a command in a memory cgroup of the given size when this machine lets the tests make one
(cgroup v1 `memory` or cgroup v2 `memory.max`, under the test's own cgroup), so a process that would pass the
limit is OOM-killed exactly as the kubelet's would be; where cgroups are not writable it runs the process plain,
and the tests compare its peak RSS (`VmHWM`) with the limit instead. Both figures are reported.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "charts" / "gpu-manager" / "values.yaml"
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 1000, "M": 1000**2, "G": 1000**3, "": 1}


def chart_memory_limit(component: str) -> int:
    """`<component>.resources.limits.memory` of the chart's values, in bytes."""
    values = yaml.safe_load(VALUES.read_text())
    text = str(values[component]["resources"]["limits"]["memory"])
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|K|M|G|)", text)
    assert m, text
    return int(m.group(1)) * _UNITS[m.group(2)]


def _cgroup_dir(limit: int, name: str) -> Path | None:
    """A fresh memory cgroup limited to `limit` bytes, or None when none can be made here."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((ln.split(":", 2)[2] for ln in lines if ":memory:" in ln), None)
    candidates: list[tuple[Path, str]] = []
    if v1 is not None:
        candidates.append((Path("/sys/fs/cgroup/memory") / v1.lstrip("/"), "memory.limit_in_bytes"))
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    if v2 is not None and Path("/sys/fs/cgroup/cgroup.controllers").exists():
        candidates.append((Path("/sys/fs/cgroup") / v2.lstrip("/"), "memory.max"))
    for base, knob in candidates:
        path = base / name
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / knob).write_text(str(limit))
            with contextlib.suppress(OSError):  # v1 with swap accounting: no swap either
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return path
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
    return None


@dataclass
class Capped:
    proc: subprocess.Popen[str]
    limit: int
    cgroup: Path | None
    log: Path
    _closed: bool = field(default=False)

    @classmethod
    def start(cls, cmd: list[str], limit: int, log: Path, env: dict[str, str]) -> Capped:
        cgroup = _cgroup_dir(limit, f"gpumgr-test-{os.getpid()}-{time.monotonic_ns()}")
        procs = None if cgroup is None else cgroup / "cgroup.procs"

        def enter() -> None:  # in the child, before exec: the whole process lives in the cgroup
            if procs is not None:
                procs.write_text(str(os.getpid()))

        out = log.open("w")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                                preexec_fn=enter)  # noqa: PLW1509 - a test helper, no threads started yet
        out.close()
        return cls(proc, limit, cgroup, log)

    @property
    def where(self) -> str:
        return f"in a {self.limit >> 20} MiB memory cgroup" if self.cgroup else "without a cgroup (not writable)"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def peak_rss(self) -> int:
        """The process's peak resident set (VmHWM), in bytes."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        assert m, status
        return int(m.group(1)) * 1024

    def wait_http(self, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # answering
            except (urllib.error.URLError, ConnectionError):
                assert self.alive(), self.output()
                assert time.monotonic() < deadline, self.output()
                time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def killed_by_oom(self) -> bool:
        return self.proc.poll() == -signal.SIGKILL

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
