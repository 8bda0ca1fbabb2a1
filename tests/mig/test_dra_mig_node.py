"""DRA claims of MIG profiles end to end over the stand-ins (the API test server, the scheduler stand-in with
partitionable devices, the kubelet DRA emulator over unix sockets) and the real DRA front end: claims of two
profiles are allocated without overlapping placements, each instance is made at its allocated placement at prepare
and destroyed when its pod goes; an agent restart keeps prepared MIG claims (restored, not freed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpumgr.devices.fake_nvml_node import mig_minors_text
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, Inventory
from gpumgr.dra.config import DRIVER_NAME
from gpumgr.dra.frontend import DraFrontEnd
from gpumgr.dra.kubeaccess import DraKube
from gpumgr.dra.mig_prepare import MigClaims
from gpumgr.dra.mig_shares import ShareSupport
from gpumgr.dra.mig_slices import parse_device_name
from gpumgr.mig import node as mig_node
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState, load_checkpoint
from gpumgr.sim.dra_scheduler import Unschedulable
from gpumgr.vdevice.server import VDeviceManager
from tests.dra.harness import NODE, DraNode, running_node

MIG_CLASS = "mig.gpumgr.io"
INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000", minor=i,
                               name="NVIDIA H100 80GB HBM3", memory_mib=81920) for i in range(2)),
                levels=(("X", "NV18"), ("NV18", "X")), driver_version="550.54.15", cuda_driver_version="12.4")


class MigDraNode(DraNode):
    def __init__(self, root: Any):
        super().__init__(root, 2)
        self.inventory = INV
        self.hardware = SimulatedMig(INV, {0: "h100-80", 1: "h100-80"}, enabled={0})  # card 1: MIG off
        (root / "mig-minors").write_text(mig_minors_text([0, 1]))

    async def start(self) -> DraNode:
        node = await super().start()
        self.api.store.create_object("deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": MIG_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}" && '
                                                          f'device.attributes["{DRIVER_NAME}"].type == "mig"'}}]}})
        return node

    async def start_agent(self) -> DraFrontEnd:
        state = NodeState(NODE, self.inventory, CheckpointStore(self.root / "ckpt"))
        load_checkpoint(state)
        self.state = state
        backend = SimulatedBackend(INV, self.hardware)
        manager, _ = await mig_node.start(state, backend)
        self.vdevices = VDeviceManager(self.layout)
        self.fe = DraFrontEnd(self.cfg, state, self.layout, self.vdevices, DraKube(self.api_client))
        self.fe.preparer.mig = MigClaims(state, manager, self.cfg.cdi_dir, self.root / "mig-minors", NODE,
                                         ShareSupport(self.cfg, self.layout, self.vdevices))
        self.fe.publisher.mig_cards = manager.cards()
        await self.fe.start()
        return self.fe


def profile_request(name: str, profile: str, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": MIG_CLASS, "selectors": [
        {"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].profile == "{profile}"'}}]}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


@pytest.fixture
async def node() -> AsyncIterator[MigDraNode]:
    async with running_node(MigDraNode) as n:
        yield n


def instances(node: MigDraNode) -> set[tuple[int, int, str]]:
    return {(i.card, i.start, i.profile) for c in node.hardware.cards() for i in c.instances}


async def test_two_profiles_allocated_apart_prepared_and_destroyed(node: MigDraNode):
    for _ in range(500):  # the counter slice is written first, then the devices
        slices = node.api.store.list_resource("resourceslices")
        if len(slices) == 2:
            break
        await asyncio.sleep(0.02)
    assert any("sharedCounters" in s["spec"] for s in slices)
    names = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    assert "gpu-1" in names and "gpu-0" not in names and "gpu-0-mig-3g-40gb-9-0" in names
    node.create_claim("big", [profile_request("gpu", "3g.40gb")])
    node.create_claim("small", [profile_request("gpu", "2g.20gb")])
    await node.run_pod("p-big", {"gpu": {"resourceClaimName": "big"}})
    await node.run_pod("p-small", {"gpu": {"resourceClaimName": "small"}})
    got = {}
    for claim in ("big", "small"):
        (result,) = node.claim(claim)["status"]["allocation"]["devices"]["results"]
        got[claim] = parse_device_name(result["device"])
    (_, _, big_start), (_, _, small_start) = got["big"], got["small"]  # type: ignore[misc]
    assert (big_start, small_start) == (0, 4)  # the 2g's first placement (0) overlaps the 3g: it got 4
    assert instances(node) == {(0, 0, "3g.40gb"), (0, 4, "2g.20gb")}
    node.create_claim("whole", [profile_request("gpu", "4g.40gb")])  # its only placement (0) is taken
    with pytest.raises(Unschedulable, match="no set of devices"):
        await node.run_pod("p-whole", {"gpu": {"resourceClaimName": "whole"}})
    uid = node.claim("big")["metadata"]["uid"]
    spec = json.loads((node.cfg.cdi_dir / f"gpumgr.io-vgpu_{uid}.json").read_text())
    slot = node.state.ledger.slots[f"mig-0-{big_start}"]  # type: ignore[union-attr]
    assert spec["devices"][0]["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={slot.uuid}"]

    first = node.kubelet.registrations
    await node.stop_agent()  # a restart: prepared MIG claims are restored, not freed
    await node.start_agent()
    await node.kubelet.wait_driver(DRIVER_NAME, after=first)  # the kubelet's new connection, before any call
    assert node.fe is not None and node.fe.recovery is not None and sorted(node.fe.recovery.freed) == []
    assert len(node.fe.recovery.restored) == 2
    assert instances(node) == {(0, 0, "3g.40gb"), (0, 4, "2g.20gb")}

    assert await node.delete_pod("p-big") == {}
    assert instances(node) == {(0, 4, "2g.20gb")}
    assert await node.delete_pod("p-small") == {}
    assert instances(node) == set() and node.state.ledger.slots == {}  # type: ignore[union-attr]
