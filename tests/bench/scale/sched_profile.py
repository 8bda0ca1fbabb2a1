"""A CPU profile of one of the bench's kube-schedulers while a path runs: Go's /debug/pprof/profile on its secure
port (kube-scheduler serves it: `enableProfiling` defaults to true), authenticated with the cluster's admin client
certificate (system:masters, which the scheduler's delegated authorization allows), then summarised with
`go tool pprof -top` against the scheduler's binary: the functions with the most CPU, inclusive and their own,
and the share of the DRA plugin and of its allocator."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import yaml

GO_CANDIDATES = ("/usr/local/go/bin/go",)
# inclusive shares worth naming in the summary: (label, a substring of the Go function's full name)
MARKERS = (
    ("the binding cycle", "bindingCycle"),
    ("DRA plugin (all its extension points)", "plugins/dynamicresources."),
    ("DRA allocator (structured.Allocate)", "dynamic-resource-allocation/structured"),
    ("CEL selectors", "cel-go"),
    ("client-go rate limiter / REST calls", "k8s.io/client-go/rest.(*Request)"),
    ("node filtering (findNodesThatPassFilters)", "findNodesThatPassFilters"),
    ("scoring (prioritizeNodes)", "prioritizeNodes"),
    ("extender calls (HTTPExtender)", "HTTPExtender"),
    ("garbage collection", "runtime.gcBgMarkWorker"),
)


def go_binary() -> str | None:
    return shutil.which("go") or next((g for g in GO_CANDIDATES if Path(g).exists()), None)


def secure_port(args: list[str]) -> int:
    return int(next(a for a in reversed(args) if a.startswith("--secure-port=")).split("=", 1)[1])


class SchedulerProfile:
    """Fetch `seconds` of CPU profile from the scheduler process `proc` in a thread (start at the path's first
    create); `finish()` waits for it and returns the summary text (the raw profile stays at `out`)."""

    def __init__(self, proc: Any, admin_kubeconfig: Path, out: Path, seconds: int):
        self.port = secure_port(proc.args)
        self.binary = proc.args[0]
        self.out = out
        self.seconds = seconds
        user = yaml.safe_load(admin_kubeconfig.read_text())["users"][0]["user"]
        self.cert, self.key = user["client-certificate"], user["client-key"]
        self.error = ""
        self._thread = threading.Thread(target=self._fetch, name="sched-pprof", daemon=True)

    def start(self) -> SchedulerProfile:
        self._thread.start()
        return self

    def _fetch(self) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate
        context.load_cert_chain(self.cert, self.key)
        url = f"https://127.0.0.1:{self.port}/debug/pprof/profile?seconds={self.seconds}"
        try:
            with urllib.request.urlopen(url, context=context, timeout=self.seconds + 60) as r:
                self.out.write_bytes(r.read())
        except OSError as error:
            self.error = str(error)

    def finish(self) -> str:
        self._thread.join(timeout=self.seconds + 90)
        if self.error or not self.out.exists():
            return f"  scheduler profile: none ({self.error or 'no answer'})"
        go = go_binary()
        if go is None:
            return f"  scheduler profile saved at {self.out} (no `go` to summarise it)"
        return summarise(go, self.binary, self.out)


def summarise(go: str, binary: str, profile: Path, count: int = 18) -> str:
    def top(*flags: str) -> list[str]:
        run = subprocess.run([go, "tool", "pprof", "-top", f"-nodecount={count}", *flags, binary, str(profile)],
                             capture_output=True, text=True, timeout=120, check=False)
        return run.stdout.splitlines()

    flat = top()
    cum = top("-cum", "-nodecount=100000")
    total = next((line for line in flat if "samples" in line or "Total" in line), "")
    lines = [f"  scheduler CPU profile {profile} ({total.strip()})", "    inclusive shares:"]
    for label, marker in MARKERS:
        share = next((_cum_share(line) for line in cum if marker in line), 0.0)
        lines.append(f"      {share:5.1f} %  {label}")
    lines.append("    own time, top functions (flat flat% sum% cum cum%):")
    body = [line for line in flat if line.strip() and line.lstrip()[0].isdigit()]
    lines += [f"      {line.strip()}" for line in body[:count]]
    return "\n".join(lines)


def _cum_share(line: str) -> float:
    """A `pprof -top -cum` row: flat flat% sum% cum cum% name -> cum%."""
    fields = line.split()
    try:
        return float(fields[4].rstrip("%"))
    except (IndexError, ValueError):
        return 0.0
