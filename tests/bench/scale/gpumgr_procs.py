"""gpumgr on the bench's cluster, as tests/realk8s/install.py installs it (the chart rendered and applied, the
extender and the chart's kube-scheduler as host processes with their ServiceAccounts' tokens), with the webhook
off (the bench's pods name their scheduler) and the extender's probe port kept, so the bench knows when it is
ready and leading. The extender listens itself on the URL the scheduler calls (no stand-in for the Service: in
a cluster kube-proxy's rules cost next to nothing; the realk8s tier's Python proxy would be timed too).
`profile=True` records the extender with py-spy while the bench runs (when installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.scale import measure
from tests.realk8s.install import NAMESPACE, Gpumgr, _env, install
from tests.realk8s.procs import Proc, free_port, wait_for

READY_TIMEOUT_S = 120.0


def start_gpumgr(cluster: Any, workdir: Path, profile: bool, values: dict[str, Any] | None = None) \
        -> tuple[Gpumgr, Extender]:
    """`values`: chart values on top of the bench's (webhook off)."""
    gm = install(cluster, workdir, {"webhook": {"enabled": False}, **(values or {})})
    probe = free_port()
    pod_name = f"{gm.name('extender')}-0"
    gm._stand_in_pod(pod_name, gm.rendered.get("Deployment", gm.name("extender")))
    env = {**_env(), "POD_NAME": pod_name, "POD_NAMESPACE": NAMESPACE}
    args = [sys.executable, "-m", "gpumgr.cli", *gm.extender_args(gm.extender_port, probe)]
    proc = Proc("extender-0", args, cluster.logs, env=env).start()
    cluster.procs.append(proc)
    gm.extenders.append(proc)
    # one replica: no leader election (on a saturated 2-core machine a missed renewal ends kube-scheduler, which
    # the tier then restarts, and the path's figures would time the restart)
    config_map = gm.rendered.get("ConfigMap", gm.name("scheduler"))
    config_map["data"]["config.yaml"] = config_map["data"]["config.yaml"].replace(
        "leaderElect: true", "leaderElect: false")
    gm.start_scheduler()
    extender = Extender(proc, probe, workdir)
    extender.wait_leading()
    if profile:
        if spy_binary() is None:
            print("  --profile: no py-spy (pip install py-spy); the extender runs without it")
        else:
            extender.start_profile(cluster)
    return gm, extender


def spy_binary() -> str | None:
    """py-spy on PATH or next to this Python (the venv's bin)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


@dataclass
class Extender:
    proc: Proc
    probe_port: int
    workdir: Path
    spy: Proc | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def readyz(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=2) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return {}

    def wait_leading(self) -> None:
        wait_for("the extender ready and leading", lambda: self.readyz().get("leader") is True, READY_TIMEOUT_S,
                 interval_s=0.5, procs=(self.proc,))

    def wait_nodes(self, count: int) -> None:
        """The watch has had time to take in `count` new nodes: its CPU stays idle for a second."""
        deadline = time.monotonic() + READY_TIMEOUT_S + count / 50
        last = measure.cpu_seconds(self.pid)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            now = measure.cpu_seconds(self.pid)
            if now - last < 0.03:
                return
            last = now

    def start_profile(self, cluster: Any) -> None:
        out = self.workdir / "extender-profile.txt"
        self.spy = Proc("py-spy", [str(spy_binary()), "record", "--pid", str(self.pid), "--format",
                                   "raw", "--gil", "--rate", "50", "--output", str(out)], cluster.logs).start()
        cluster.procs.append(self.spy)

    def stop_profile(self) -> None:
        if self.spy is None:
            return
        subprocess.run(["kill", "-INT", str(self.spy.pid)], check=False)
        self.spy.popen.wait(timeout=60) if self.spy.popen else None
        out = self.workdir / "extender-profile.txt"
        if out.exists():
            print(top_frames(out.read_text()))


def top_frames(raw: str, count: int = 25) -> str:
    """py-spy's raw (collapsed stacks) output -> the functions with the most samples, self and inclusive."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        samples = int(n)
        total += samples
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + samples
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + samples
    lines = [f"extender profile: {total} samples holding the GIL (py-spy --gil, 50 Hz)", "  inclusive:"]
    for frame, hits in sorted(inclusive.items(), key=lambda kv: -kv[1])[:count]:
        lines.append(f"    {100 * hits / max(1, total):5.1f} %  {frame}")
    lines.append("  self:")
    for frame, hits in sorted(own.items(), key=lambda kv: -kv[1])[:count]:
        lines.append(f"    {100 * hits / max(1, total):5.1f} %  {frame}")
    return "\n".join(lines)
