"""Malformed or hostile calls on the agent's sockets get a clear gRPC status and change nothing."""

from __future__ import annotations

import grpc
import pytest

from gpumgr.deviceplugin import ids as devids
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.pb import vdevice_pb2 as vpb
from gpumgr.pb import vdevice_pb2_grpc as vpb_grpc
from tests.e2e.harness import mounts_of, sim_node


async def call_allocate(node, socket: str, ids: list[str]) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / socket}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pb_grpc.DevicePluginStub(ch).Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
    return e.value


async def test_unknown_ids_wrong_counts_and_malformed_requests_are_refused():
    async with sim_node("dgx-a100") as node:
        await node.run_pod("existing", [("main", 30, 4)])
        before = node.agent.state.ledger.to_json()
        g0, g1 = node.inventory.gpus[0], node.inventory.gpus[1]
        core0, core1 = devids.core_ids(g0), devids.core_ids(g1)
        cases = [
            (["GPU-not-here::c01"], grpc.StatusCode.INVALID_ARGUMENT, "names a card this node does not have"),
            (["garbage"], grpc.StatusCode.INVALID_ARGUMENT, "not a gpumgr device ID"),
            (core0[:50] + core1[:10], grpc.StatusCode.INVALID_ARGUMENT, "a share must be on one card"),
            (core0 + core1[:50], grpc.StatusCode.INVALID_ARGUMENT, "multiple of 100"),
            (core0[:100] + core1[:100][:-1] + core0[:1], grpc.StatusCode.INVALID_ARGUMENT, "listed twice"),
            ([], grpc.StatusCode.INVALID_ARGUMENT, "no device IDs"),
            (devids.memory_ids(g0, 256)[:4], grpc.StatusCode.INVALID_ARGUMENT, "is not a vcuda-core device ID"),
            (core0[:20], grpc.StatusCode.FAILED_PRECONDITION, "no pending pod"),
        ]
        for ids, code, words in cases:
            err = await call_allocate(node, "vcore.sock", ids)
            assert err.code() == code, (ids[:2], err.details())
            assert words in err.details() and "tencent.com/vcuda-core" in err.details()
        err = await call_allocate(node, "vmemory.sock", core0[:2])
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a vcuda-memory device ID" in err.details()
        async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}") as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Allocate(pb.AllocateRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as e:  # IDs the kubelet never gave anyone
                await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=core1[:10]), timeout=10)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "refusing to write limits for an unverified container" in e.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=["bogus"], allocation_size=1)]),
                    timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert node.agent.state.ledger.to_json() == before


async def test_vdevice_register_from_the_wrong_pod_is_denied():
    async with sim_node("gtx1080ti") as node:
        a = await node.run_pod("a", [("main", 30, 4)])
        await node.run_pod("b", [("main", 20, 2)])
        uid_a = node.pod("a")["metadata"]["uid"]
        uid_b = node.pod("b")["metadata"]["uid"]
        sock = f"unix://{mounts_of(a, 'main')['/etc/vcuda']}/vcuda.sock"
        async with grpc.aio.insecure_channel(sock) as ch:
            stub = vpb_grpc.VDeviceStub(ch)
            ok = await stub.Register(vpb.RegisterRequest(), timeout=5)  # empty: the socket says who calls
            assert ok.core_limit == 30 and ok.hard_limit and ok.devices[0].memory_limit_bytes == 4 * 256 << 20
            ok = await stub.Register(vpb.RegisterRequest(pod_uid=uid_a, container_name="main", pid=1), timeout=5)
            assert ok.core_limit == 30
            for bad in (vpb.RegisterRequest(pod_uid=uid_b), vpb.RegisterRequest(container_name="other")):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Register(bad, timeout=5)
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert node.agent.service.vdevices.registrations == 2
