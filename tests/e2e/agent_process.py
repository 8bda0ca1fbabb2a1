"""The agent as a real separate process (`gpumgr run --simulate`), for tests that kill it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet import KubeletEmulator
from gpumgr.sim.node import shim_source_for
from tests.helpers import topo_path


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


@dataclass
class ProcessNode:
    """A node whose agent is its own process: API test server and kubelet emulator here, `gpumgr run` there."""

    workdir: Path
    name: str
    spec: Path
    api: KubeApiServer
    kubelet: KubeletEmulator
    agent: AgentProcess

    def bound_pod(self, name: str, cores: int, memory_units: int) -> dict[str, Any]:
        limits = {podspec.RESOURCE_CORE: str(cores), podspec.RESOURCE_MEMORY: str(memory_units)}
        return self.api.store.create_pod({
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": self.name, "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}]},
        })


@contextlib.asynccontextmanager
async def process_node(name: str, topo: str, memory_mib: int, *agent_args: str) -> AsyncIterator[ProcessNode]:
    workdir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    spec = write_spec(workdir / "node.yaml", topo_path(topo), memory_mib)
    api = KubeApiServer()
    await api.start()
    api.write_kubeconfig(workdir / "kubeconfig")
    api.store.create_node({"metadata": {"name": name}})
    kubelet = KubeletEmulator(workdir / "dp")
    await kubelet.start()
    agent = AgentProcess(workdir, name, spec, *agent_args)
    try:
        yield ProcessNode(workdir, name, spec, api, kubelet, agent)
    finally:
        agent.kill9()
        await kubelet.stop()
        await api.stop()
        shutil.rmtree(workdir, ignore_errors=True)
