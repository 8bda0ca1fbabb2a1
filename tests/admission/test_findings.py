"""Issue 10's findings, each through the real protocols: the kubelet emulator admitting pods over the agent's
unix sockets, the API test server, the agent's files on disk."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import aiohttp
import grpc
import pytest

from gpumgr.deviceplugin import ids as devids
from gpumgr.node import binding
from gpumgr.node.kubelet_checkpoint import KubeletCheckpointError, read_kubelet_checkpoint
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.requests import podspec
from gpumgr.vdevice.layout import allocation_key
from gpumgr.vdevice.limits import Limits
from tests.e2e.harness import sim_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY
UNIT = 256


def recorded_on(node, card: int) -> dict[str, str]:
    return {f"{podspec.ANN_PREDICATE_IDX}0": str(node.inventory.gpus[card].minor)}


def limits_of(admitted, container: str = "main") -> Limits:
    mounts = {m.container_path: m.host_path for m in admitted.container(container).responses[CORE].mounts}
    return Limits.parse((Path(mounts["/etc/vcuda"]) / "limits").read_text())


def card_of(node, admitted, container: str = "main") -> int:
    uuid = admitted.container(container).responses[CORE].envs["NVIDIA_VISIBLE_DEVICES"]
    return node.inventory.by_uuid(uuid).index


async def devices_written(node) -> None:
    """Until the kubelet has written the device lists of both plugins to its checkpoint."""
    want = {CORE: 100 * len(node.inventory.gpus), MEM: sum(g.memory_mib // UNIT for g in node.inventory.gpus)}
    for _ in range(500):
        try:
            got = read_kubelet_checkpoint(node.kubelet.checkpoint_path).registered_devices
        except KubeletCheckpointError:
            got = {}
        if all(len(got.get(r, ())) == n for r, n in want.items()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the kubelet never wrote the device lists")


async def seen(node, *pods) -> None:
    """Until the agent's pod watch has these pods (Allocate would wait for them too, up to a few seconds)."""
    svc = node.agent.service
    for _ in range(500):
        if all(svc.pods.get(p["metadata"]["uid"]) for p in pods):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the agent never saw the pods")


@pytest.mark.parametrize("order", ["sorted", "reverse"])
@pytest.mark.parametrize("records", [True, False])
async def test_a_later_larger_pod_admitted_first_is_not_stranded(order, records):
    """Finding 1: card 0 has 3.5 GiB left; `a-small` (2 GiB) is older than `b-large` (10 GiB); the kubelet admits
    `b-large` first. Both must start, each with its own limits."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        filler = node.create_pod("filler", [("main", 60, 50)], annotations=recorded_on(node, 0))
        await seen(node, filler)
        assert card_of(node, await node.admit(filler)) == 0
        a = node.create_pod("a-small", [("main", 30, 8)], annotations=recorded_on(node, 0) if records else {})
        b = node.create_pod("b-large", [("main", 30, 40)], annotations=recorded_on(node, 1) if records else {})
        await seen(node, a, b)
        got_b = await node.admit(b, order)
        assert card_of(node, got_b) == 1
        assert limits_of(got_b).pod_uid == b["metadata"]["uid"]
        assert limits_of(got_b).devices[0].memory_limit_bytes == 40 * UNIT << 20
        got_a = await node.admit(a, order)
        assert limits_of(got_a).devices[0].memory_limit_bytes == 8 * UNIT << 20
        mine = {a.pod: (a.cards, a.memory_mib, a.verified)
                for a in node.agent.state.ledger.allocations.values()}
        assert mine["b-large"] == ((1,), 40 * UNIT, True)
        assert mine["a-small"][1:] == (8 * UNIT, True)
        assert node.agent.service.unsafe_refusals == 0


@pytest.mark.parametrize("order", ["sorted", "reverse"])
async def test_container_memory_annotation_is_its_own_or_absent(order):
    """Finding 2: with a 2 GiB and a 10 GiB pod pending, the container annotation of the one admitted is never
    the other's memory; memory-first admission makes it known."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        a = node.create_pod("a-small", [("main", 30, 8)])
        b = node.create_pod("b-large", [("main", 30, 40)])
        await seen(node, a, b)
        await devices_written(node)  # a kubelet rewriting its checkpoint between the two calls voids the hint
        got = await node.admit(b, order)
        ann = dict(got.container("main").responses[CORE].annotations)
        assert ann.get("tencent.com/vcuda-memory") in (None, str(40 * UNIT << 20))
        if order == "reverse":  # its vcuda-memory Allocate came first: the agent knows which pod it is
            assert ann["tencent.com/vcuda-memory"] == str(40 * UNIT << 20)
        got = await node.admit(a, order)  # the only one left: known for sure
        ann = dict(got.container("main").responses[CORE].annotations)
        assert ann["tencent.com/vcuda-memory"] == str(8 * UNIT << 20)


async def _fill_card_1(node) -> None:
    whole = node.create_pod("whole", [("main", 100, 0)], annotations=recorded_on(node, 1))
    await seen(node, whole)
    assert card_of(node, await node.admit(whole)) == 1


async def test_an_orphan_of_a_crash_before_the_kubelet_heard_is_freed_when_the_kubelet_reuses_its_room():
    """Finding 3: an allocation committed for a pod whose admission then failed (the agent died before the kubelet
    got the answer) and that was deleted must not hold its room until the unrecorded grace (60 s) runs out."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        await _fill_card_1(node)
        filler = node.create_pod("filler", [("main", 60, 8)])
        await seen(node, filler)
        await node.admit(filler)
        p = node.create_pod("p", [("main", 30, 8)])
        await seen(node, p)
        free = sorted(set(devids.core_ids(node.inventory.gpus[0])) - node.kubelet.allocated(CORE))
        async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}") as ch:
            await pb_grpc.DevicePluginStub(ch).Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=free[5:35])]), timeout=10)  # the kubelet never heard
        await node.stop_agent()  # the agent goes down with the orphan in its checkpoint
        node.api.store.set_pod_phase("default", "p", "Failed")  # UnexpectedAdmissionError
        node.api.store.delete_pod("default", "p")
        await node.start_agent()
        assert any(a.pod == "p" for a in node.agent.state.ledger.allocations.values())
        q = node.create_pod("q", [("main", 30, 8)])
        await seen(node, q)
        got = await node.admit(q)  # the kubelet shows 40 cores free on card 0: admitted at once
        assert card_of(node, got) == 0
        pods = sorted(a.pod for a in node.agent.state.ledger.allocations.values())
        assert pods == ["filler", "q", "whole"]


@pytest.mark.parametrize("same_ids", [True, False])
async def test_a_share_freed_by_a_deletion_is_admitted_at_once(same_ids):
    """Finding 4: a share freed by a pod deletion and handed by the kubelet to a new pod 0 ms later is taken,
    without waiting for the pod watch."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        await _fill_card_1(node)
        for i in range(12):
            ask = 70 if same_ids or i % 2 else 60 + i
            x = node.create_pod(f"x{i}", [("main", ask, 40)])
            await seen(node, x)
            await node.admit(x)
            await node.delete_pod(f"x{i}")
            y = node.create_pod(f"y{i}", [("main", 70, 40)])
            await node.admit(y)  # no wait at all: the watch has not told the agent about x's deletion
            await node.delete_pod(f"y{i}")
        assert node.agent.service.unsafe_refusals == 0


async def test_device_ids_never_advertised_are_refused():
    """Finding 5: `::c100`..`::c199`, `::m9999`, or a number written differently are not IDs of this plugin."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        g0 = node.inventory.gpus[0]
        p = node.create_pod("p", [("main", 1, 1)])
        await seen(node, p)
        before = node.agent.state.ledger.to_json()
        core_bad = [[f"{g0.uuid}::c100"], [f"{g0.uuid}::c199"], [f"{g0.uuid}::c5"], [f"{g0.uuid}::c005"]]
        mem_bad = [[f"{g0.uuid}::m9999"], [f"{g0.uuid}::m64"]]
        async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}") as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            for ids in core_bad:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Allocate(pb.AllocateRequest(container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ids
                assert "never advertised" in e.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ids
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=1)]),
                        timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ids
        async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vmemory.sock'}") as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            for ids in mem_bad:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Allocate(pb.AllocateRequest(container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ids
                assert "never advertised" in e.value.details()
        assert node.agent.state.ledger.to_json() == before


async def test_a_pod_that_cannot_fit_at_prestart_is_failed_clearly_and_frees_what_it_held():
    """A container the kubelet records on a card that cannot hold it (here: a guess made for a smaller pod) does not
    hang: PreStart refuses, the pod is Failed with a condition and an event saying why and what to do, and the
    devices it held are free again."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        filler = node.create_pod("filler", [("main", 60, 50)], annotations=recorded_on(node, 0))
        await seen(node, filler)
        await node.admit(filler)
        small = node.create_pod("small", [("main", 30, 8)])
        big = node.create_pod("big", [("main", 30, 40)])
        await seen(node, small, big)
        ids = sorted(set(devids.core_ids(node.inventory.gpus[0])) - node.kubelet.allocated(CORE))[:30]
        key = allocation_key(ids)
        cand = binding.Candidate(small, binding.find_container(small, "main"), None, ())
        await st.commit(lambda ledger: ledger.assign(svc._allocation_for(cand, (0,), key)))
        ckpt = node.workdir / "kubelet_checkpoint_for_test"  # the kubelet's record: these IDs are big's
        ckpt.write_text(json.dumps({"Data": {"PodDeviceEntries": [
            {"PodUID": big["metadata"]["uid"], "ContainerName": "main", "ResourceName": CORE,
             "DeviceIDs": {"0": ids}}], "RegisteredDevices": {}}, "Checksum": 1}))
        svc.config = dataclasses.replace(svc.config, kubelet_checkpoint=ckpt)
        async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pb_grpc.DevicePluginStub(ch).PreStartContainer(
                    pb.PreStartContainerRequest(devices_ids=ids), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not fit" in e.value.details()
        assert st.ledger.held_by(key) is None
        await svc.drain()  # the pod is marked Failed in the background, once the ledger change is committed
        pod = node.pod("big")
        assert pod["status"]["phase"] == "Failed"
        cond = [c for c in pod["status"]["conditions"] if c["type"] == "gpumgr.io/GPUAllocated"]
        assert cond and cond[0]["status"] == "False" and "recreates it" in cond[0]["message"]
        events = [ev for ev in node.api.store.list_events("default")
                  if ev["involvedObject"]["name"] == "big" and ev["reason"] == "GPUAllocationUnfit"]
        assert events and "does not fit" in events[0]["message"]
        assert svc.prestart_failures == 1


async def test_an_admission_that_no_answer_could_make_safe_is_refused_and_counted():
    """The kubelet ignores the preferred cards and offers a card where one of the pods it could be admitting does
    not fit: Allocate refuses (the pod is recreated by its owner) instead of starting something that strands."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        filler = node.create_pod("filler", [("main", 60, 50)], annotations=recorded_on(node, 0))
        await seen(node, filler)
        await node.admit(filler)
        a = node.create_pod("a-small", [("main", 30, 8)])
        b = node.create_pod("b-large", [("main", 30, 40)])
        await seen(node, a, b)
        before = node.agent.state.ledger.to_json()
        ids = sorted(set(devids.core_ids(node.inventory.gpus[0])) - node.kubelet.allocated(CORE))[:30]
        async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pb_grpc.DevicePluginStub(ch).Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "b-large" in e.value.details()
        assert node.agent.state.ledger.to_json() == before
        assert node.agent.service.unsafe_refusals == 1
        async with aiohttp.ClientSession() as http, http.get(f"{node.agent.http.url}/metric") as r:
            scrape = await r.text()
        assert 'gpumgr_allocation_failures_total{reason="unsafe_guess"} 1.0' in scrape


async def test_a_repaired_guess_of_an_init_container_keeps_the_pods_single_reservation():
    """Two pods whose init containers ask the same cores: the guess for the first init container is repaired at its
    PreStart; its app container, reusing those devices, must still share the init container's reservation (found
    by the property run: it was refused as unsafe)."""
    async with sim_node("a10-4x", memory_mib=8192) as node:  # 32 units per card
        p0 = node.create_pod("p0", [("main", 30, 3)], init_containers=[("init", 16, 1)])
        p1 = node.create_pod("p1", [("main", 70, 31)], init_containers=[("init", 16, 2)])
        await seen(node, p0, p1)
        got = await node.admit(p1)
        assert card_of(node, got, "main") == card_of(node, got, "init")
        assert limits_of(got).devices[0].memory_limit_bytes == 31 * UNIT << 20
        await node.admit(p0)
        assert node.agent.service.unsafe_refusals == 0
        held = sum(a.memory_mib for a in node.agent.state.ledger.allocations.values() if a.pod == "p1"
                   and a.reserve)
        assert held == 31 * UNIT
