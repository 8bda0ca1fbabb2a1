"""`gpumgr run --mode both | dra` through the real Agent: the DRA front end is started by the agent itself, shares
its ledger, checkpoint and vDevice servers with the device plugins, and survives the agent's reconcile."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gpumgr.agent.reconcile import reconcile
from gpumgr.dra.config import DRIVER_NAME
from gpumgr.requests import podspec
from gpumgr.sim.dra_scheduler import DraScheduler
from gpumgr.sim.kubelet.dra_kubelet import DraKubelet
from gpumgr.sim.node import SimNode
from tests.dra.harness import NS, device_classes, inventory, share_request


def _extra(root: Path, mode: str) -> dict[str, str]:
    return {"mode": mode, "cdi_dir": str(root / "cdi"), "dra_plugin_dir": str(root / "plugins" / DRIVER_NAME),
            "plugins_registry_dir": str(root / "registry")}


async def _slice_devices(node: SimNode, timeout: float = 10.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        slices = node.api.store.list_resource("resourceslices")
        if slices:
            return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        assert loop.time() < deadline, "the agent published no ResourceSlice"
        await asyncio.sleep(0.02)


async def test_both_mode_serves_gpu_manager_pods_and_claims_from_one_ledger() -> None:
    root = Path(tempfile.mkdtemp(prefix="am", dir="/tmp"))
    node = SimNode(root, inventory(2), node_name="both-node", extra=_extra(root, "both"))
    kubelet = DraKubelet(root / "registry", [root / "cdi"], node.api.store, "both-node")
    try:
        await node.start()
        for dc in device_classes():
            node.api.store.create_object("deviceclasses", dc)
        await kubelet.start()
        await kubelet.wait_driver(DRIVER_NAME)
        assert node.agent is not None and node.agent.dra is not None

        # a gpu-manager pod takes 50 cores and 8 GiB of a card through the device plugins
        await node.run_pod("legacy", [("main", 50, 32)])
        held = next(a for a in node.agent.state.ledger.allocations.values() if not a.key.startswith("dra/"))
        card = held.cards[0]

        # the slice shows what is left of that card, so the scheduler cannot double-book it
        async def left() -> bool:
            return (await _slice_devices(node))[f"gpu-{card}"]["capacity"]["cores"]["value"] == "50"
        for _ in range(500):
            if await left():
                break
            await asyncio.sleep(0.02)
        assert await left()

        # a DRA claim through the stock-scheduler stand-in and the kubelet's DRA calls
        node.api.store.create_object("resourceclaims", {"metadata": {"name": "c"},
                                                        "spec": {"devices": {"requests": [share_request()]}}}, NS)
        node.api.store.create_pod({"metadata": {"name": "p", "namespace": NS}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}]}})
        DraScheduler(node.api.store).schedule_pod(NS, "p", ["both-node"])
        await kubelet.run_pod(NS, "p")

        ledger = node.agent.state.ledger
        claims = [a for a in ledger.allocations.values() if a.key.startswith("dra/")]
        assert len(claims) == 1 and len(ledger.allocations) == 2
        for c in ledger.cards:  # nothing double-booked on any card
            assert c.used_cores <= 100 and c.free_memory_mib >= 0

        # the device-plugin reconcile keeps the claim and its vDevice server
        service = node.agent.service
        assert service is not None
        running_before = set(service.vdevices.running())
        await reconcile(service, True, 0.0, "test")
        assert [a.key for a in node.agent.state.ledger.allocations.values() if a.key.startswith("dra/")] \
            == [claims[0].key]
        assert set(service.vdevices.running()) == running_before
    finally:
        await kubelet.stop()
        await node.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_dra_mode_serves_no_device_plugins_and_is_ready() -> None:
    root = Path(tempfile.mkdtemp(prefix="am", dir="/tmp"))
    node = SimNode(root, inventory(2), node_name="dra-only", extra=_extra(root, "dra"))
    kubelet = DraKubelet(root / "registry", [root / "cdi"], node.api.store, "dra-only")
    try:
        await node.start(agent=False)
        await kubelet.start()
        from gpumgr.agent.daemon import Agent
        from gpumgr.kube.client import KubeClient

        node.kube = KubeClient.connect(str(node.kubeconfig))
        node.agent = Agent(node.config, node.backend, node.kube)
        await node.agent.start()
        await kubelet.wait_driver(DRIVER_NAME)
        assert node.agent.ready
        assert node.agent.supervisor is None
        assert not node.kubelet.devices(podspec.RESOURCE_CORE)
        assert len(await _slice_devices(node)) == 2
    finally:
        await kubelet.stop()
        await node.stop()
        shutil.rmtree(root, ignore_errors=True)
