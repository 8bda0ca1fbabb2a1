"""The kubelet-facing sockets: registration info and the DRAResourceHealth stream on the DRA socket."""

from __future__ import annotations

import asyncio

import grpc

from gpumgr.pb import drahealth_pb2 as hpb
from gpumgr.pb import drahealth_pb2_grpc as hpb_grpc
from gpumgr.pb import pluginregistration_pb2 as rpb
from gpumgr.pb import pluginregistration_pb2_grpc as rpb_grpc
from tests.dra.harness import NODE, DraNode


async def test_registration_info(node: DraNode):
    async with grpc.aio.insecure_channel(f"unix://{node.cfg.registration_socket}") as ch:
        info = await rpb_grpc.RegistrationStub(ch).GetInfo(rpb.InfoRequest(), timeout=5)
    assert node.cfg.registration_socket.name == "vgpu.gpumgr.io-reg.sock"
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin", "vgpu.gpumgr.io", str(node.cfg.plugin_dir / "dra.sock"), ["v1.DRAPlugin"])
    assert node.fe is not None and node.fe.registration.registrations == 1


async def test_health_stream_follows_the_cards(node: DraNode):
    assert node.state is not None
    async with grpc.aio.insecure_channel(f"unix://{node.cfg.socket}") as ch:
        stream = hpb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(hpb.NodeWatchResourcesRequest())
        first = await asyncio.wait_for(stream.read(), 5)
        assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
            (NODE, f"gpu-{i}", hpb.HEALTHY) for i in range(4)]
        await node.state.set_reason(1, "ecc uncorrectable", True)
        second = await asyncio.wait_for(stream.read(), 5)
        sick = second.devices[1]
        assert sick.health == hpb.UNHEALTHY and sick.message == "ecc uncorrectable"
        assert sick.health_check_timeout_seconds > 0 and sick.last_updated_time > 0
        assert [d.health for d in second.devices] == [hpb.HEALTHY, hpb.UNHEALTHY, hpb.HEALTHY, hpb.HEALTHY]
        await node.state.set_reason(1, "ecc uncorrectable", False)
        third = await asyncio.wait_for(stream.read(), 5)
        assert [d.health for d in third.devices] == [hpb.HEALTHY] * 4
        stream.cancel()


async def test_health_stream_repeats_the_full_list_with_the_current_time(node: DraNode, monkeypatch):
    from gpumgr.dra import plugin

    assert node.fe is not None
    now = [1_000_000]
    monkeypatch.setattr(plugin, "HEALTH_PERIOD_S", 0.05)
    monkeypatch.setattr(node.fe.health, "clock", lambda: now[0])
    async with grpc.aio.insecure_channel(f"unix://{node.cfg.socket}") as ch:
        stream = hpb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(hpb.NodeWatchResourcesRequest())
        first = await asyncio.wait_for(stream.read(), 5)
        assert {d.last_updated_time for d in first.devices} == {1_000_000}
        now[0] = 1_000_045  # nothing changes; the kubelet still hears from us, stamped now
        later = await asyncio.wait_for(stream.read(), 5)
        while later.devices[0].last_updated_time != 1_000_045:
            later = await asyncio.wait_for(stream.read(), 5)
        assert len(later.devices) == 4 and {d.last_updated_time for d in later.devices} == {1_000_045}
        assert {d.health for d in later.devices} == {hpb.HEALTHY}
        assert all(d.health_check_timeout_seconds > 45 for d in later.devices)
        stream.cancel()
