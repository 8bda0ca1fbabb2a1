"""`gpumgr run` as an operator meets it: bad flags and a node without NVML end with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "run", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_no_nvml_on_this_machine_is_one_log_line_and_exit_3(tmp_path):
    p = run("--node-name", "n1", "--kubeconfig", str(tmp_path / "none"), "--checkpoint-dir", str(tmp_path / "c"))
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "ERROR" in ln]
    assert len(errors) == 1 and "GPU discovery failed" in errors[0] and "NVML" in errors[0]


def test_bad_flags_are_refused_before_anything_starts(tmp_path):
    for args, words in [
        (("--temp-healthy", "99"), "health settings"),
        (("--health-ignore-xids", "13,x"), "comma list of numbers"),
        (("--check-period", "0"), "--check-period '0': timeouts must be positive and finite seconds, from 0.1"),
        (("--check-period", "nan"), "--check-period 'nan'"),
        (("--check-period", "1e9"), "--check-period '1e9'"),
        (("--unrecorded-grace", "inf"), "--unrecorded-grace 'inf': expected seconds from 0 to 86400"),
        (("--unrecorded-grace", "86401"), "--unrecorded-grace '86401'"),
        (("--memory-unit-mib", str(10**12)), "--memory-unit-mib"),
        (("--memory-unit-mib", "0"), "--memory-unit-mib '0': expected a whole number from 1 to 65536"),
        (("--temp-unhealthy", "1000"), "--temp-unhealthy '1000'"),
        (("--temp-healthy", "٣٠"), "--temp-healthy"),
        (("--metrics-addr", "nowhere"), "HOST:PORT"),
        (("--log-level", "loud"), "--log-level 'loud': expected one of"),
    ]:
        p = run("--node-name", "n1", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert words in p.stderr and "Traceback" not in p.stderr
    p = run(env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "--node-name" in p.stderr


def test_in_cluster_without_the_service_environment_is_one_line_and_exit_2(tmp_path):
    spec = tmp_path / "node.yaml"
    spec.write_text("defaults: {model: T4, memory_mib: 16384}\ngpus: [{}]\ntopology: {levels: [[X]]}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    p = run("--node-name", "n1", "--simulate", str(spec), "--checkpoint-dir", str(tmp_path / "c"), env=env)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("gpumgr run: in-cluster: KUBERNETES_SERVICE_HOST")
