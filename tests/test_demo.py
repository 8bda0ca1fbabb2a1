"""`gpumgr demo --once` as a newcomer runs it: the whole system on a simulated node, exit 0 (the agent in `both`
mode: gpu-manager pods through the device plugins and a DRA pod through its ResourceClaim, over one ledger); and
its NVML flavour, with the agent on the real nvidia-ml-py over the fake libnvidia-ml.so.1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import nvml_node

GIB = 2**30


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "demo", "--once", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def once() -> subprocess.CompletedProcess[str]:
    """One `gpumgr demo --once` run, shared by the tests that read its output."""
    return demo("--metrics-port", "0")


def dra_claim(out: str) -> tuple[str, int, str]:
    """(claim namespace/name, card, ledger key) of the demo's DRA pod, from its allocation line."""
    m = re.search(r"^  -> claim (default/dra-infer-gpu-[a-z0-9]+) allocated: card (\d) \(gpu-\2\), consumed memory "
                  r"4Gi, cores 30; CDI device gpumgr\.io/vgpu=claim-([0-9a-f-]{36})-gpu-\2$", out, flags=re.M)
    assert m, out[-3000:]
    return m.group(1), int(m.group(2)), f"dra/{m.group(3)}/0"


def test_demo_once_runs_every_step_and_exits_cleanly(once: subprocess.CompletedProcess[str]):
    p = once
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


def test_demo_once_runs_a_dra_pod_next_to_the_gpu_manager_pods(once: subprocess.CompletedProcess[str]):
    out = once.stdout
    assert once.returncode == 0, once.stderr[-2000:]
    assert "the agent also serves DRA (mode both)" in out
    dra_step = out.split("a DRA pod next to them", 1)[1].split("\n== ", 1)[0]
    notebooks = out.index("pod nb-carol asks")
    assert out.index("a DRA pod next to them") > notebooks  # after the gpu-manager fractional notebooks
    assert "pod dra-infer asks a ResourceClaim (template dra-infer-share, DeviceClass vgpu.gpumgr.io): " \
           "memory: 4Gi, cores: 30" in dra_step
    claim, card, key = dra_claim(dra_step)
    # the shim limits file in the claim's vDevice directory: exactly 4 GiB and 30 cores
    m = re.search(rf"ledger {re.escape(key)}; shim limits file \w+/limits: memory_limit (\d+) bytes \((\d+) MiB\), "
                  r"core_limit (\d+) = the claim's consumed capacity$", dra_step, flags=re.M)
    assert m, dra_step
    assert (int(m.group(1)), int(m.group(2)), int(m.group(3))) == (4 * GIB, 4096, 30)
    # the card table shows the claim as a holder of its card, next to the gpu-manager pods on the others
    rows = {int(ln.split()[0]): ln for ln in dra_step.splitlines() if re.match(r"^\d+\s+NVIDIA", ln)}
    assert len(rows) == 8, dra_step
    assert re.search(rf"\sshared\s+ok\s+30/100\s+4096/\d+ MiB\s+claim {re.escape(claim)} \(30c/4096MiB\)$",
                     rows[card])
    assert sum(claim in r for r in rows.values()) == 1
    assert "default/nb-alice/jupyter (30c/4096MiB)" in dra_step and "default/infer/server" in dra_step
    # the claim's request reaches /metric like the gpu-manager pods'
    assert re.search(r'container_request_gpu_memory\{[^}]*pod_name="dra-infer"[^}]*\} 4096\.0', out)


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
    _, _, key = dra_claim(out)  # the DRA front end works on the NVML backend too
    assert re.search(rf"ledger {re.escape(key)}; .* memory_limit {4 * GIB} bytes .* core_limit 30 = ", out)
    assert out.rstrip().endswith("demo finished")


def test_demo_nvml_without_the_library_names_the_make_target(tmp_path: Path):
    p = demo("--nvml", "--nvml-lib", str(tmp_path / "libnvidia-ml.so.1"), "--metrics-port", "0")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "make fake-nvml" in line and str(tmp_path) in line
