"""Shares of a MIG instance end to end over the stand-ins (the API test server, the scheduler stand-in, the kubelet
DRA emulator over unix sockets) and the real DRA front end: two share claims land on one MIG device (one instance,
made at the first prepare), each container gets the MIG UUID, the shim and its own limits file; a third share that
does not fit the instance goes to another placement (a second instance); the instances go with their last pod; an
agent restart keeps the shares and their limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpumgr.dra.config import DRIVER_NAME
from gpumgr.dra.mig_slices import parse_device_name
from gpumgr.sim.dra_scheduler import Unschedulable
from gpumgr.vdevice.limits import Limits
from tests.dra.harness import running_node
from tests.mig.test_dra_mig_node import MigDraNode, instances, profile_request

SHARE = {"memory": "8Gi", "cores": "40"}


@pytest.fixture
async def node() -> AsyncIterator[MigDraNode]:
    async with running_node(MigDraNode) as n:
        yield n


def limits_of(env: dict[str, str], node: MigDraNode) -> Limits:
    """The limits file the container's shim reads (VCUDA_LIMITS in the container is /etc/vcuda/limits: the vDevice
    directory the CDI spec mounts there)."""
    assert env["VCUDA_LIMITS"] == "/etc/vcuda/limits"
    [vdevice_dir] = [p for p in node.layout.root.iterdir() if (p / "limits").exists()
                     and Limits.parse((p / "limits").read_text()).pod_uid == env["_POD_UID"]]
    return Limits.parse((Path(vdevice_dir) / "limits").read_text())


async def test_two_shares_on_one_instance_a_third_elsewhere(node: MigDraNode):
    for _ in range(500):  # the counter slice is written first, then the devices
        if len(node.api.store.list_resource("resourceslices")) == 2:
            break
        await asyncio.sleep(0.02)
    for name in ("a", "b", "c"):
        node.create_claim(name, [profile_request("gpu", "3g.40gb", SHARE)])
    pods = {name: await node.run_pod(f"p-{name}", {"gpu": {"resourceClaimName": name}}) for name in ("a", "b")}
    ra, rb = (node.claim(n)["status"]["allocation"]["devices"]["results"][0] for n in ("a", "b"))
    assert ra["device"] == rb["device"] and ra["shareID"] != rb["shareID"]
    assert ra["consumedCapacity"] == {"memory": "8Gi", "cores": "40"}
    card, _, start = parse_device_name(ra["device"]) or (0, 0, 0)
    assert instances(node) == {(card, start, "3g.40gb")}  # one instance for both shares
    assert node.state is not None
    slot = node.state.ledger.slots[f"mig-{card}-{start}"]
    for name, pod in pods.items():
        [edits] = pod.containers.values()
        assert edits.env["NVIDIA_VISIBLE_DEVICES"] == slot.uuid and edits.env["LD_PRELOAD"].endswith("libvcuda.so")
        caps = [n["path"] for n in edits.device_nodes if "nvidia-caps" in n["path"]]
        assert len(caps) == 2 and any(n["path"] == f"/dev/nvidia{card}" for n in edits.device_nodes)
        limits = limits_of({**edits.env, "_POD_UID": pod.uid}, node)
        assert limits.core_limit == 40 and [(d.uuid, d.index, d.memory_limit_bytes) for d in limits.devices] == [
            (slot.uuid, card, 8 << 30)], name

    await node.run_pod("p-c", {"gpu": {"resourceClaimName": "c"}})  # 120 cores would not fit: another placement
    rc = node.claim("c")["status"]["allocation"]["devices"]["results"][0]
    assert rc["device"] != ra["device"]
    assert len(instances(node)) == 2
    node.create_claim("d", [profile_request("gpu", "4g.40gb")])  # both 3g placements are taken: none left
    with pytest.raises(Unschedulable, match="no set of devices"):
        await node.run_pod("p-d", {"gpu": {"resourceClaimName": "d"}})

    first = node.kubelet.registrations
    await node.stop_agent()  # a restart: shares restored with their limits, nothing freed
    await node.start_agent()
    await node.kubelet.wait_driver(DRIVER_NAME, after=first)
    assert node.fe is not None and node.fe.recovery is not None and node.fe.recovery.freed == []
    assert len(instances(node)) == 2 and len(node.state.ledger.slot_holders[slot.name]) == 2

    assert await node.delete_pod("p-a") == {}
    assert (card, start, "3g.40gb") in instances(node)  # b still holds it
    assert await node.delete_pod("p-b") == {}
    assert (card, start, "3g.40gb") not in instances(node)
    assert await node.delete_pod("p-c") == {}
    assert instances(node) == set() and node.state.ledger.slots == {}
