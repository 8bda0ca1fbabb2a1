"""`gpumgr run` on the real nvidia-ml-py over the fake libnvidia-ml.so.1 (a DGX A100), as its own process, against
the kubelet emulator and the Kubernetes API test server: it registers, admits a pod, reports each card's NUMA
node as sysfs says, and an XID on one card makes that card's units, and only those, Unhealthy."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from gpumgr.deviceplugin import ids as devids
from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet import ContainerRequest, KubeletEmulator
from gpumgr.sim.node import shim_source_for
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.helpers import topo_path

pytestmark = pytest.mark.timeout(120)
CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


def agent_args(workdir: Path, node: str, sysfs: Path) -> list[str]:
    return [
        sys.executable, "-m", "gpumgr.cli", "run", "--node-name", node,
        "--kubeconfig", str(workdir / "kubeconfig"), "--device-plugin-dir", str(workdir / "dp"),
        "--vdevice-root", str(workdir / "vm"), "--checkpoint-dir", str(workdir / "ckpt"),
        "--dev-root", str(workdir / "dev"), "--metrics-addr", "127.0.0.1:0",
        "--shim-dir", str(workdir / "vdriver"), "--shim-source", str(shim_source_for(workdir)),
        "--driver-root", str(workdir / "driver-root"), "--log-level", "info",
        "--nvml-lib", str(nvml_node.library()), "--sysfs-root", str(sysfs),
    ]


async def test_agent_on_real_binding_allocates_and_takes_out_exactly_the_faulty_card():
    nvml_node.build()
    workdir = Path(tempfile.mkdtemp(prefix="gpn", dir="/tmp"))  # short: unix socket paths are bounded
    inv = inventory_from_topo_file(topo_path("dgx-a100"), memory_mib=40960)
    node = FakeNvmlNode(workdir / "nvml", inv).write()
    sysfs = node.write_sysfs(workdir / "sys", {i: 3 - i // 2 for i in range(8)})  # not what NVML would say
    api = KubeApiServer()
    await api.start()
    api.write_kubeconfig(workdir / "kubeconfig")
    api.store.create_node({"metadata": {"name": "nvml-node"}})
    kubelet = KubeletEmulator(workdir / "dp")
    await kubelet.start()
    log = open(workdir / "agent.log", "wb")  # noqa: SIM115 - closed below
    agent = subprocess.Popen(agent_args(workdir, "nvml-node", sysfs), stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, **node.env(), "PYTHONFAULTHANDLER": "1"})
    try:
        for res in (CORE, MEM):
            await kubelet.wait_registered(res, timeout=60)
            await kubelet.wait_for(lambda r=res: len(kubelet.devices(r)) > 0 and all(
                h == "Healthy" for h in kubelet.devices(r).values()), 60)
        assert len(kubelet.devices(CORE)) == 800
        by_uuid = {g.uuid: g.index for g in inv.gpus}
        numa = {by_uuid[devids.split(d)[0]]: nodes for d, nodes in kubelet.topology(CORE).items()}
        assert numa == {i: (3 - i // 2,) for i in range(8)}

        limits = {CORE: "100", MEM: "4"}
        pod = api.store.create_pod({
            "metadata": {"name": "whole", "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": "nvml-node", "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}]}})
        admitted = await kubelet.admit_pod(pod["metadata"]["uid"], [ContainerRequest("main", {CORE: 100, MEM: 4})])
        envs = admitted.container("main").responses[CORE].envs
        (card_uuid,) = envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert card_uuid in by_uuid

        def sick(res: str) -> set[int]:
            return {by_uuid[devids.split(d)[0]] for d, h in kubelet.devices(res).items() if h != "Healthy"}

        node.xid(3, 79)
        # each resource's plugin streams its own update: wait for both (the memory one may come second)
        await kubelet.wait_for(lambda: 3 in sick(CORE) and 3 in sick(MEM), 30)
        node.xid(5, 13)  # an application XID: ignored, and logged after the first one
        await kubelet.wait_for(lambda: b"XID 13" in (workdir / "agent.log").read_bytes(), 30)
        assert sick(CORE) == {3}
        assert sick(MEM) == {3}
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=60)  # generous: the machine may be busy
            except subprocess.TimeoutExpired:
                agent.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to the log
                agent.wait(timeout=10)
        log.close()
        await kubelet.stop()
        await api.stop()
        text = (workdir / "agent.log").read_text(errors="replace")
        shutil.rmtree(workdir, ignore_errors=True)
    assert agent.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
