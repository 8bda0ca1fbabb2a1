"""`gpumgr run` on the real nvidia-ml-py over the fake NVML with two H100s, one in MIG mode, as its own process
against the kubelet emulator and the Kubernetes API test server: the layout from the node label is applied, the
device plugin nvidia.com/mig-1g.10gb registers seven instances, a pod gets one (its parent node, capability nodes
and MIG UUID), an XID on that instance marks it alone, and after kill -9 the restarted agent serves the same
instances with the pod's holding kept."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest

from gpumgr.devices.types import GPU, Inventory
from gpumgr.node import inventory as node_inventory
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.requests.podspec import ANN_NODE_INVENTORY
from gpumgr.sim.kubelet import ContainerRequest
from gpumgr.sim.node import shim_source_for
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.mig.harness import finish_agent_run, start_agent_run

pytestmark = pytest.mark.timeout(180)
MIG_1G = "nvidia.com/mig-1g.10gb"
INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-e2e", minor=i, name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920) for i in range(2)), levels=(("X", "NV18"), ("NV18", "X")))


def agent_args(workdir: Path, node: FakeNvmlNode, mig_flags: tuple[str, ...] = ("--mig-layout", "all-3g.40gb")
               ) -> list[str]:
    """`gpumgr run` on the fake NVML node in `workdir`, with these MIG flags (the layout by default)."""
    return [
        sys.executable, "-m", "gpumgr.cli", "run", "--node-name", "mig-node",
        "--kubeconfig", str(workdir / "kubeconfig"), "--device-plugin-dir", str(workdir / "dp"),
        "--vdevice-root", str(workdir / "vm"), "--checkpoint-dir", str(workdir / "ckpt"),
        "--dev-root", str(workdir / "dev"), "--metrics-addr", "127.0.0.1:0",
        "--shim-dir", str(workdir / "vdriver"), "--shim-source", str(shim_source_for(workdir)),
        "--driver-root", str(workdir / "driver-root"), "--log-level", "info",
        "--nvml-lib", str(nvml_node.library()), "--sysfs-root", str(workdir / "sys"),
        *mig_flags, "--mig-minors", str(node.mig_minors),
    ]


async def test_agent_serves_a_mig_layout_and_survives_kill_9():
    nvml_node.build()
    workdir = Path(tempfile.mkdtemp(prefix="gpm", dir="/tmp"))
    node = FakeNvmlNode(workdir / "nvml", INV, mig={0: "h100-80", 1: "h100-80"}, mig_on=(0,)).write()
    api, kubelet, log, env = await start_agent_run(workdir, node, {"nvidia.com/mig.config": "all-1g.10gb"})
    agent = subprocess.Popen(agent_args(workdir, node), stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        await kubelet.wait_registered(MIG_1G, timeout=90)
        # the label won over the flag; the Hopper card with MIG off was switched on at once (no reset needed)
        await kubelet.wait_for(lambda: len(kubelet.devices(MIG_1G)) == 14, 60)
        def labels() -> dict[str, str]:
            return (api.store.get_node("mig-node") or {}).get("metadata", {}).get("labels") or {}

        await kubelet.wait_for(lambda: "nvidia.com/mig.capable" in labels(), 30)
        mine = {k: v for k, v in labels().items() if k.startswith("nvidia.com/mig")}
        assert mine == {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.capable": "true",
                        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config.state": "success",
                        "nvidia.com/mig-1g.10gb.count": "14", "nvidia.com/mig-1g.10gb.memory": "9984",
                        "nvidia.com/mig-1g.10gb.multiprocessors": "16", "nvidia.com/mig-1g.10gb.slices.gi": "1",
                        "nvidia.com/mig-1g.10gb.slices.ci": "1", "nvidia.com/mig-1g.10gb.replicas": "1",
                        "nvidia.com/mig-1g.10gb.sharing-strategy": "none"}  # GPU Feature Discovery's names
        # both cards are in MIG mode: their vcuda units are not offered (a pod would be refused on them)
        await kubelet.wait_for(lambda: len(kubelet.devices("tencent.com/vcuda-core")) == 200, 30)
        assert set(kubelet.devices("tencent.com/vcuda-core").values()) == {"Unhealthy"}
        annotations = (api.store.get_node("mig-node") or {}).get("metadata", {}).get("annotations") or {}
        published = node_inventory.decode(annotations[ANN_NODE_INVENTORY])  # the extender's view
        assert published.unhealthy == {0, 1}
        # and its MIG cards: profiles with their placements, the layout's instances (gpumgr/node/mig_inventory.py)
        assert published.mig is not None and published.mig.prefix == "nvidia.com/mig-"
        assert [c.index for c in published.mig.cards] == [0, 1] and published.mig.static_count("1g.10gb") == 14
        card0 = published.mig.cards[0]
        assert [(i.profile, i.start, i.origin) for i in card0.instances] == [("1g.10gb", s, "layout") for s in range(7)]
        three = card0.profile("3g.40gb")
        assert three is not None and three.starts == (0, 4) and card0.free_starts(three) == ()
        limits = {MIG_1G: "1"}
        pod = api.store.create_pod({
            "metadata": {"name": "mig", "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": "mig-node", "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}]}})
        admitted = await kubelet.admit_pod(pod["metadata"]["uid"], [ContainerRequest("main", {MIG_1G: 1})])
        resp = admitted.container("main").responses[MIG_1G]
        (mig_uuid,) = admitted.container("main").device_ids[MIG_1G]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid and mig_uuid.startswith("MIG-")
        paths = [d.host_path for d in resp.devices]
        assert paths[0] == "/dev/nvidia0" and paths[-1] == "/dev/nvidiactl" and len(paths) == 4
        assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths[1:3])
        slot = next(s for s in CheckpointStore(workdir / "ckpt").load().snapshot.ledger.slots.values()
                    if s.uuid == mig_uuid)
        url = re.search(rb"metrics on (http://\S+)/metric", (workdir / "agent.log").read_bytes())
        assert url is not None
        def metric() -> str:
            return urllib.request.urlopen(url.group(1).decode() + "/metric", timeout=30).read().decode()

        # the holding is named after its pod, from the kubelet checkpoint (gpumgr/mig/holdings.py)
        await kubelet.wait_for(lambda: 'holder="pod default/mig"' in metric(), 30)
        text = await asyncio.to_thread(metric)
        assert 'gpumgr_mig_instances{gpu="gpu0",profile="1g.10gb",uuid="GPU-00000000-e2e"} 7.0' in text
        held = [line for line in text.splitlines() if line.startswith("gpumgr_mig_instance{")
                and f'mig_uuid="{mig_uuid}"' in line]
        assert len(held) == 1 and 'holder=""' not in held[0] and 'origin="layout"' in held[0]
        status = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gpumgr.cli", "status", "--addr",
                                                          url.group(1).decode()], capture_output=True, timeout=60)
        out = status.stdout.decode()
        assert status.returncode == 0 and "MIG PROFILE" in out, status.stderr.decode()[-2000:]
        line = next(x for x in out.splitlines() if mig_uuid in x)
        assert line.split()[:3] == ["0", "1g.10gb", f"{slot.start}-{slot.start}"] and "layout" in line
        node.xid(0, 48, (slot.gi or 0, slot.ci or 0))
        await kubelet.wait_for(lambda: kubelet.devices(MIG_1G)[mig_uuid] == "Unhealthy", 30)
        assert [h for d, h in kubelet.devices(MIG_1G).items() if d != mig_uuid] == ["Healthy"] * 13
        before = dict(kubelet.devices(MIG_1G))

        agent.send_signal(signal.SIGKILL)  # kill -9, then the same agent again
        agent.wait(timeout=30)
        agent = subprocess.Popen(agent_args(workdir, node), stdout=log, stderr=subprocess.STDOUT, env=env)
        for res in (MIG_1G, "tencent.com/vcuda-core", "tencent.com/vcuda-memory"):  # registered again
            await kubelet.wait_registered(res, timeout=90, count=2)
        # the same instances (health is re-learnt at every start, as for whole cards: XID reasons are not kept)
        await kubelet.wait_for(lambda: set(kubelet.devices(MIG_1G)) == set(before)
                               and set(kubelet.devices(MIG_1G).values()) == {"Healthy"}, 60)
        ledger = CheckpointStore(workdir / "ckpt").load().snapshot.ledger
        assert ledger.slot_holders[slot.name]  # the pod's holding survived the restart
        assert sorted(s.start for s in ledger.slots.values() if s.card == 0) == list(range(7))
        assert sorted(s.start for s in ledger.slots.values() if s.card == 1) == list(range(7))
    finally:
        text = await finish_agent_run(agent, log, kubelet, api, workdir, "gpumgr-mig-agent-last.log")
    assert agent.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
