"""A live layout change: `gpumgr run` on the real nvidia-ml-py over the fake NVML (two H100s in MIG mode, the node
label `nvidia.com/mig.config=all-1g.10gb`), as its own process against the kubelet emulator and the Kubernetes API
test server. A pod holds one 1g.10gb instance of card 0; the label changes to all-3g.40gb while the agent serves:
card 1 is re-made as two 3g.40gb instances and a `nvidia.com/mig-3g.40gb` device plugin registers them, card 0 is
refused with its reason (the pod holding it) and `nvidia.com/mig.config.state=failed`; once the pod is gone the
agent applies the layout to card 0 as well, the 1g.10gb resource goes to 0 devices and its labels go, and the state
turns `success`. A label naming no known layout is refused and changes nothing."""

from __future__ import annotations

import re
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from gpumgr.devices.types import GPU, Inventory
from gpumgr.sim.kubelet import ContainerRequest
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.mig.harness import finish_agent_run, start_agent_run
from tests.mig.test_agent_mig import agent_args

pytestmark = pytest.mark.timeout(300)
ONE = "nvidia.com/mig-1g.10gb"
THREE = "nvidia.com/mig-3g.40gb"
INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-live", minor=i, name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920) for i in range(2)), levels=(("X", "NV18"), ("NV18", "X")))


async def test_a_changed_layout_label_is_applied_to_free_cards_while_serving():
    nvml_node.build()
    workdir = Path(tempfile.mkdtemp(prefix="gml", dir="/tmp"))
    node = FakeNvmlNode(workdir / "nvml", INV, mig={0: "h100-80", 1: "h100-80"}, mig_on=(0, 1)).write()
    api, kubelet, log, env = await start_agent_run(workdir, node, {"nvidia.com/mig.config": "all-1g.10gb"})
    agent = subprocess.Popen(agent_args(workdir, node), stdout=log, stderr=subprocess.STDOUT, env=env)

    def labels() -> dict[str, str]:
        return (api.store.get_node("mig-node") or {}).get("metadata", {}).get("labels") or {}

    try:
        await kubelet.wait_registered(ONE, timeout=90)
        await kubelet.wait_for(lambda: len(kubelet.devices(ONE)) == 14, 60)
        await kubelet.wait_for(lambda: labels().get("nvidia.com/mig.config.state") == "success", 30)
        limits = {ONE: "1"}
        pod = api.store.create_pod({
            "metadata": {"name": "holder", "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": "mig-node", "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}]},
            "status": {"phase": "Running"}})
        admitted = await kubelet.admit_pod(pod["metadata"]["uid"], [ContainerRequest("main", {ONE: 1})])
        (held,) = admitted.container("main").device_ids[ONE]
        text = (workdir / "agent.log").read_text(errors="replace")
        card_of_held = 0 if held in re.findall(r"MIG card 0: created 1g\.10gb at memory slice \d+ \(GI \d+, (\S+)\)",
                                               text) else 1

        # a layout name the agent does not know: refused with the reason, nothing touched
        api.store.merge_patch_node("mig-node", {"metadata": {"labels": {"nvidia.com/mig.config": "halves"}}})
        await kubelet.wait_for(lambda: labels().get("nvidia.com/mig.config.state") == "failed", 60)
        assert len(kubelet.devices(ONE)) == 14 and "unknown MIG layout 'halves'" in (workdir / "agent.log").read_text()

        api.store.merge_patch_node("mig-node", {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.40gb"}}})
        await kubelet.wait_registered(THREE, timeout=60)
        await kubelet.wait_for(lambda: len(kubelet.devices(THREE)) == 2, 60)  # the free card, re-made
        await kubelet.wait_for(lambda: len(kubelet.devices(ONE)) == 7, 60)  # the held card's instances stay
        assert held in kubelet.devices(ONE)
        await kubelet.wait_for(lambda: labels().get("nvidia.com/mig-3g.40gb.count") == "2", 30)
        assert labels()["nvidia.com/mig.config.state"] == "failed" and labels()["nvidia.com/mig-1g.10gb.count"] == "7"
        assert labels()["nvidia.com/mig.config"] == "all-3g.40gb"  # the operator's label is never touched
        text = (workdir / "agent.log").read_text(errors="replace")
        assert re.search(rf"MIG refused: layout all-3g.40gb: card {card_of_held}: MIG instance mig-{card_of_held}-\d+ "
                         r"is in use by pod default/holder", text), text[-3000:]

        await kubelet.remove_pod(pod["metadata"]["uid"])  # the holder goes: the layout reaches that card too
        api.store.delete_pod("default", "holder")
        await kubelet.wait_for(lambda: len(kubelet.devices(THREE)) == 4 and not kubelet.devices(ONE), 90)
        await kubelet.wait_for(lambda: labels().get("nvidia.com/mig.config.state") == "success", 30)
        assert not [k for k in labels() if k.startswith("nvidia.com/mig-1g.10gb.")], labels()
        assert kubelet.allocatable(ONE) == 0
    finally:
        text = await finish_agent_run(agent, log, kubelet, api, workdir, "gpumgr-mig-live-agent-last.log")
    assert agent.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
