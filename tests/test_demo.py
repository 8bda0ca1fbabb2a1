"""`gpumgr demo --once` as a newcomer runs it: the whole system on a simulated node, exit 0."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_once_runs_every_step_and_exits_cleanly():
    p = subprocess.run([sys.executable, "-m", "gpumgr.cli", "demo", "--once", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=300)
    out = p.stdout
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert re.search(r"kubelet admitted container trainer: GPU\[(\d, ){3}\d\], whole cards", out)
    assert "shim on (limits enforced in-process)" in out
    assert re.search(r"not scheduled: demo-node: container trainer: needs 3 free whole cards", out)
    assert "UNHEALTHY" in out and "unhealthy: xid (XID 79)" in p.stderr
    assert re.search(r"default/nb-alice/jupyter \(30c/4096MiB\)", out)
    assert re.search(r"Prometheus metrics: http://127\.0\.0\.1:\d+/metric", out)
    assert 'container_request_gpu_utilization{container_name="jupyter"' in out
    assert out.rstrip().endswith("demo finished")
