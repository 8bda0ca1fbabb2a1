"""`gpumgr run --mig-shared 1g.10gb=4` on the real nvidia-ml-py over the fake NVML (one H100 in MIG mode with a
3g.40gb and two 1g.10gb instances), as its own process against the kubelet emulator and the Kubernetes API test
server: the 1g.10gb instances are served as eight `nvidia.com/mig-1g.10gb.shared` replicas next to the whole
`nvidia.com/mig-3g.40gb`; GPU Feature Discovery's replicas labels; a pod's share is allocated, the agent is killed
(-9) between Allocate and PreStartContainer and PreStart after the restart still writes the share's limits; /metric
and `gpumgr status` name the pods and the share; killed again, the restarted agent serves the share's vDevice
socket again; the pod's deletion releases the share; a whole instance's holder is named after its pod."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpumgr.devices.types import GPU, Inventory
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.pb import vdevice_pb2 as vpb
from gpumgr.pb import vdevice_pb2_grpc as vpb_grpc
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet import ContainerRequest
from gpumgr.vdevice.limits import Limits
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.mig import test_agent_mig
from tests.mig.harness import finish_agent_run, start_agent_run

pytestmark = pytest.mark.timeout(300)
SHARED = "nvidia.com/mig-1g.10gb.shared"
WHOLE = "nvidia.com/mig-3g.40gb"
INV = Inventory(gpus=(GPU(index=0, uuid="GPU-00000000-share", minor=0, name="NVIDIA H100 80GB HBM3",
                          memory_mib=81920),), levels=(("X",),))


def agent_args(workdir: Path, node: FakeNvmlNode) -> list[str]:
    return test_agent_mig.agent_args(workdir, node, ("--mig-layouts-file", str(workdir / "layouts.json"),
                                                     "--mig-layout", "mix", "--mig-shared", "1g.10gb=4"))


def pod(api: KubeApiServer, name: str, resource: str, n: int) -> dict[str, Any]:
    limits = {resource: str(n)}
    return api.store.create_pod({
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"nodeName": "mig-node", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}]},
        "status": {"phase": "Running"}})


def get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=30).read().decode()


async def test_agent_serves_shares_of_an_instance_across_kill_9():
    nvml_node.build()
    workdir = Path(tempfile.mkdtemp(prefix="gms", dir="/tmp"))
    (workdir / "layouts.json").write_text(json.dumps({"mix": {"0": ["3g.40gb", "1g.10gb", "1g.10gb"]}}))
    node = FakeNvmlNode(workdir / "nvml", INV, mig={0: "h100-80"}, mig_on=(0,)).write()
    api, kubelet, log, env = await start_agent_run(workdir, node, {})
    agent = subprocess.Popen(agent_args(workdir, node), stdout=log, stderr=subprocess.STDOUT, env=env)

    def agent_url() -> str:
        found = re.findall(rb"metrics on (http://\S+)/metric", (workdir / "agent.log").read_bytes())
        assert found
        return found[-1].decode()

    try:
        await kubelet.wait_registered(SHARED, timeout=90)
        await kubelet.wait_registered(WHOLE, timeout=90)
        await kubelet.wait_for(lambda: len(kubelet.devices(SHARED)) == 8 and len(kubelet.devices(WHOLE)) == 1, 60)

        def labels() -> dict[str, str]:
            return (api.store.get_node("mig-node") or {}).get("metadata", {}).get("labels") or {}

        await kubelet.wait_for(lambda: "nvidia.com/mig-1g.10gb.replicas" in labels(), 30)
        assert {k: v for k, v in labels().items() if k.startswith("nvidia.com/mig-")
                and k.endswith((".replicas", ".sharing-strategy", ".count"))} == {
            "nvidia.com/mig-1g.10gb.count": "2", "nvidia.com/mig-1g.10gb.replicas": "4",
            "nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing", "nvidia.com/mig-3g.40gb.count": "1",
            "nvidia.com/mig-3g.40gb.replicas": "1", "nvidia.com/mig-3g.40gb.sharing-strategy": "none"}

        one = pod(api, "one", SHARED, 1)
        admitted = await kubelet.admit_pod(one["metadata"]["uid"], [ContainerRequest("main", {SHARED: 1})],
                                           start=False)
        got = admitted.container("main")
        (rid,) = got.device_ids[SHARED]
        mig_uuid = rid.split("::")[0]
        resp = got.responses[SHARED]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid and "LD_PRELOAD" in resp.envs
        vdir = Path(next(m.host_path for m in resp.mounts if m.container_path == "/etc/vcuda"))
        # the directory is made before the answer; the limits come once the container is named (at PreStart, or
        # earlier by the reconcile when the kubelet's checkpoint already names it)
        assert vdir.is_dir()
        ledger = CheckpointStore(workdir / "ckpt").load().snapshot.ledger  # type: ignore[union-attr]
        (share,) = [a for a in ledger.allocations.values() if a.mig is not None]
        slot = ledger.slots[share.mig or ""]
        assert slot.uuid == mig_uuid and (share.cores, share.memory_mib) == (25, slot.memory_mib // 4)

        agent.send_signal(signal.SIGKILL)  # kill -9 between Allocate and PreStartContainer
        agent.wait(timeout=30)
        agent = subprocess.Popen(agent_args(workdir, node), stdout=log, stderr=subprocess.STDOUT, env=env)
        await kubelet.wait_registered(SHARED, timeout=90, count=2)
        await kubelet.start_pod(admitted)  # PreStartContainer on the restarted agent
        limits = Limits.parse((vdir / "limits").read_text())
        assert limits.pod_uid == one["metadata"]["uid"] and limits.core_limit == 25
        assert [(d.uuid, d.memory_limit_bytes) for d in limits.devices] == [(mig_uuid, (slot.memory_mib // 4) << 20)]

        big = pod(api, "big", WHOLE, 1)
        await kubelet.admit_pod(big["metadata"]["uid"], [ContainerRequest("main", {WHOLE: 1})])
        url = agent_url()

        def metric() -> str:
            return get(url + "/metric")

        await kubelet.wait_for(lambda: 'holder="pod default/big"' in metric(), 60)  # named from the kubelet's record
        text = metric()
        series = (f'gpumgr_mig_share_memory_bytes{{gpu="gpu0",holder="pod default/one",mig_uuid="{mig_uuid}",'
                  'profile="1g.10gb"} ')
        line = next(x for x in text.splitlines() if x.startswith(series))
        assert float(line[len(series):]) == (slot.memory_mib // 4) << 20
        status = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gpumgr.cli", "status", "--addr", url],
                                         capture_output=True, timeout=60)
        out = status.stdout.decode()
        assert status.returncode == 0, status.stderr.decode()[-2000:]
        assert f"pod default/one (25%, {slot.memory_mib // 4} MiB)" in out and "pod default/big" in out, out

        agent.send_signal(signal.SIGKILL)  # kill -9 with the share running: its vDevice server comes back
        agent.wait(timeout=30)
        (vdir / "vcuda.sock").unlink(missing_ok=True)
        agent = subprocess.Popen(agent_args(workdir, node), stdout=log, stderr=subprocess.STDOUT, env=env)
        await kubelet.wait_registered(SHARED, timeout=90, count=3)
        await kubelet.wait_for(lambda: (vdir / "vcuda.sock").exists(), 60)
        async with grpc.aio.insecure_channel(f"unix://{vdir / 'vcuda.sock'}") as ch:
            answer = await vpb_grpc.VDeviceStub(ch).Register(vpb.RegisterRequest(
                pod_uid=one["metadata"]["uid"], container_name="main"), timeout=30)
        assert [(d.uuid, d.memory_limit_bytes, d.compute) for d in answer.devices] == [
            (mig_uuid, (slot.memory_mib // 4) << 20, "gpm")]  # an H100 instance: GPM feedback

        await kubelet.remove_pod(one["metadata"]["uid"])  # the pod goes: its share is released
        api.store.delete_pod("default", "one")

        def shares() -> list[Any]:
            led = CheckpointStore(workdir / "ckpt").load().snapshot.ledger  # type: ignore[union-attr]
            return [a for a in led.allocations.values() if a.mig == slot.name]

        await kubelet.wait_for(lambda: not shares() and not vdir.exists(), 60)
    finally:
        text = await finish_agent_run(agent, log, kubelet, api, workdir, "gpumgr-mig-shared-agent-last.log")
    assert agent.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
