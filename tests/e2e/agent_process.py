"""The agent as a real separate process (`gpumgr run --simulate`), for tests that kill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from gpumgr.sim.node import shim_source_for


def write_spec(path: Path, topo_file: Path, memory_mib: int) -> Path:
    path.write_text(yaml.safe_dump({"defaults": {"model": "NVIDIA A100-SXM4-40GB", "memory_mib": memory_mib},
                                    "driver_version": "550.54.15", "cuda_driver_version": "12.4",
                                    "topology": {"file": str(topo_file)}}))
    return path


class AgentProcess:
    def __init__(self, workdir: Path, node_name: str, spec: Path, *extra: str):
        self.workdir = workdir
        self.args = [
            sys.executable, "-m", "gpumgr.cli", "run", "--node-name", node_name,
            "--kubeconfig", str(workdir / "kubeconfig"), "--device-plugin-dir", str(workdir / "dp"),
            "--vdevice-root", str(workdir / "vm"), "--checkpoint-dir", str(workdir / "ckpt"),
            "--dev-root", str(workdir / "dev"), "--simulate", str(spec), "--metrics-addr", "127.0.0.1:0",
            "--shim-dir", str(workdir / "vdriver"), "--shim-source", str(shim_source_for(workdir)),
            "--driver-root", str(workdir / "driver-root"),
            "--log-level", "info", *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.generation = 0

    def start(self) -> None:
        self.generation += 1
        log = open(self.workdir / f"agent-{self.generation}.log", "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode if self.proc else None

    def logs(self) -> str:
        return "\n".join((self.workdir / f"agent-{g}.log").read_text(errors="replace")
                         for g in range(1, self.generation + 1))
