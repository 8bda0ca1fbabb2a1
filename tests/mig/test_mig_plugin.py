"""The device plugin of a MIG profile over a real unix-socket gRPC: ListAndWatch lists the layout's instances by
MIG UUID, Allocate answers with the parent's device node, the instance's capability nodes (from mig-minors) and
the UUID (env and CDI) and records the holding before answering; an event on one instance marks that instance only
(the event's GI comes through the real nvidia-ml-py from the fake NVML)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpumgr.deviceplugin import mig as plugin
from gpumgr.devices.fake_nvml_node import mig_minors_text
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, Inventory
from gpumgr.mig import layout as lay
from gpumgr.mig.apply import apply_layout
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from tests.fakes.nvml_fixtures import MakeBackend
from tests.mig.harness import Node, Steps

INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-h100", minor=[3, 5][i], name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920) for i in range(2)), levels=(("X", "NV18"), ("NV18", "X")))


async def test_list_allocate_and_instance_health(tmp_path: Path):
    node = Node(tmp_path / "ckpt", [81920, 81920], SimulatedBackend(INV, SimulatedMig(INV, {0: "h100-80"}, {0})),
                Steps(None))
    node.mig.reconcile()
    apply_layout(node.mig, lambda: node.ledger, lay.parse("two", {"two": {"0": ["3g.40gb", "1g.10gb"]}}))
    state = NodeState("node-1", INV, CheckpointStore(tmp_path / "ckpt"))
    state.ledger = node.ledger
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors_text([3, 5]))
    health = plugin.MigHealth()
    cfg = plugin.MigPluginConfig(mig_minors=minors, cdi=True)
    servicer = plugin.MigPluginServicer(state, "1g.10gb", plugin.resource_name("1g.10gb"), health, cfg)
    big = plugin.MigPluginServicer(state, "3g.40gb", plugin.resource_name("3g.40gb"), health, cfg)
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
    sock = tmp_path / plugin.socket_name("1g.10gb")
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            watch = stub.ListAndWatch(pb.Empty())
            first = await watch.read()
            small = next(s for s in node.ledger.slots.values() if s.profile == "1g.10gb")
            assert [(d.ID, d.health) for d in first.devices] == [(small.uuid, "Healthy")]
            assert [d.ID for d in big.devices()] == [s.uuid for s in node.ledger.slots.values()
                                                      if s.profile == "3g.40gb"]
            resp = await stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[small.uuid])]))
            c = resp.container_responses[0]
            gi_node = 3 + 9 * (small.gi or 0)  # in mig-minors, GPU minor 3 comes first: gi<G> at 3 + 9G, ci0 next
            assert [d.host_path for d in c.devices] == [
                "/dev/nvidia3", f"/dev/nvidia-caps/nvidia-cap{gi_node}", f"/dev/nvidia-caps/nvidia-cap{gi_node + 1}",
                "/dev/nvidiactl"]
            assert c.envs["NVIDIA_VISIBLE_DEVICES"] == small.uuid
            assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={small.uuid}"]
            assert list(state.ledger.slot_holders[small.name]) == [plugin.allocation_key(small.uuid)]
            assert CheckpointStore(tmp_path / "ckpt").load().snapshot.ledger.slot_holders[small.name]  # written
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["MIG-not-here"])]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "no 1g.10gb instance 'MIG-not-here' on this node" in (e.value.details() or "")
            assert plugin.mark(health, state.ledger, 0, small.gi, "XID 48") == small.name
            await state.commit(lambda led: None)  # any change wakes ListAndWatch
            again = await watch.read()
            assert [(d.ID, d.health) for d in again.devices] == [(small.uuid, "Unhealthy")]
            assert {d.health for d in big.devices()} == {"Healthy"}  # the card's other instance is fine
            watch.cancel()
    finally:
        await server.stop(0)
        state.close()


def test_an_xid_on_an_instance_names_its_gi(make_backend: MakeBackend):
    backend, node = make_backend(INV, mig={0: "h100-80"}, mig_on=(0,))
    backend.inventory()
    inst = backend.mig_create(0, 19, 2)
    node.xid(0, 48, (inst.gi, inst.ci))
    node.xid(0, 79)
    events = backend.wait_events(2.0) + backend.wait_events(2.0)
    assert [(e.kind, e.code, e.gi) for e in events] == [("xid", 48, inst.gi), ("xid", 79, None)]
