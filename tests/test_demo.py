"""`gpumgr demo --once` as a newcomer runs it: the whole system on a simulated node, exit 0; and its NVML
flavour, with the agent on the real nvidia-ml-py over the fake libnvidia-ml.so.1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.fakes import nvml_node


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "demo", "--once", *args],
                          capture_output=True, text=True, timeout=300)


def test_demo_once_runs_every_step_and_exits_cleanly():
    p = demo("--metrics-port", "0")
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
    # --once stops everything at the end: no pointing `gpumgr status` at a server that is gone
    assert not re.search(r"gpumgr status --addr http", out)
    assert "stopped with the demo" in out


def test_demo_port_out_of_range_is_one_line_and_exit_2():
    p = demo("--metrics-port", "99999")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == ["gpumgr demo: --metrics-port must be 0..65535, got 99999"]


def test_demo_nvml_flavour_runs_the_agent_on_the_real_binding():
    nvml_node.build()
    p = demo("--nvml", "--metrics-port", "0", "--log-level", "info")
    out, err = p.stdout, p.stderr
    assert p.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert "real NVML binding (nvidia-ml-py)" in out
    assert re.search(r"kubelet admitted container trainer: GPU\[(\d, ){3}\d\], whole cards", out)
    unhealthy = re.findall(r"card (\d) \(GPU-[^)]*\) unhealthy: (\w+)", err)
    assert {card for card, _ in unhealthy} == {"7"}, err[-2000:]  # XID 79 on GPU 7: that card and no other
    assert re.search(r"card 7 \(GPU-[^)]*\) healthy: ", err)
    assert out.rstrip().endswith("demo finished")


def test_demo_nvml_without_the_library_names_the_make_target(tmp_path: Path):
    p = demo("--nvml", "--nvml-lib", str(tmp_path / "libnvidia-ml.so.1"), "--metrics-port", "0")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "make fake-nvml" in line and str(tmp_path) in line
