"""Shares inside a static MIG instance (`--mig-shared 1g.10gb=4`), through the agent in process against the kubelet
emulator (unix-socket gRPC: registration, ListAndWatch, GetPreferredAllocation, Allocate, PreStartContainer, the
kubelet checkpoint) and the Kubernetes API test server: each 1g.10gb instance is four devices of
`nvidia.com/mig-1g.10gb.shared`; a container given one gets a quarter of the instance's memory and 25 cores in
the ledger (inside the slot), the vCUDA answer (shim, vDevice directory) with the MIG parts, and at PreStart its
limits file and vDevice server naming the MIG UUID; two replicas are kept on one instance; a container's replicas
spanning instances are refused; a deleted pod's share is released and its directory removed; the holder is named
after the pod."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpumgr.devices.fake_nvml_node import mig_minors_text
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, Inventory
from gpumgr.metrics.mig import mig_families
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.sim.kubelet import ContainerRequest
from gpumgr.sim.node import SimNode
from gpumgr.vdevice.limits import Limits

pytestmark = pytest.mark.timeout(120)
SHARED = "nvidia.com/mig-1g.10gb.shared"
WHOLE = "nvidia.com/mig-3g.40gb"
INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-share", minor=[3, 5][i], name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920, bus_id=f"00000000:0{i + 1}:00.0") for i in range(2)),
                levels=(("X", "NV18"), ("NV18", "X")))


def make_node(tmp_path: Path) -> SimNode:
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors_text([3, 5]))
    layouts = tmp_path / "layouts.json"
    layouts.write_text(json.dumps({"shares": {"0": ["3g.40gb", "1g.10gb", "1g.10gb"]}}))
    backend = SimulatedBackend(INV, SimulatedMig(INV, {0: "h100-80"}, {0}))
    return SimNode(tmp_path / "node", INV, backend=backend, mig_layout="shares", mig_layouts_file=str(layouts),
                   mig_minors=minors, mig_shared=(("1g.10gb", 4),))


def pod(node: SimNode, name: str, n: int) -> dict[str, Any]:
    limits = {SHARED: str(n)}
    return node.api.store.create_pod({
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"nodeName": node.node_name, "containers": [
            {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}]},
        "status": {"phase": "Running"}})


@pytest.fixture
def short_dir() -> Any:
    d = Path(tempfile.mkdtemp(prefix="gms", dir="/tmp"))  # vDevice sockets: a unix socket path is short
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_a_share_inside_an_instance_gets_its_memory_limit(short_dir: Path):
    node = make_node(short_dir)
    await node.start()
    try:
        kubelet = node.kubelet
        await kubelet.wait_registered(SHARED, timeout=30)
        await kubelet.wait_registered(WHOLE, timeout=30)
        await kubelet.wait_for(lambda: len(kubelet.devices(SHARED)) == 8 and len(kubelet.devices(WHOLE)) == 1, 30)
        assert node.agent is not None and node.agent.state is not None
        state = node.agent.state
        small = sorted((s for s in state.ledger.slots.values() if s.profile == "1g.10gb"), key=lambda s: s.start)
        assert set(kubelet.devices(SHARED)) == {f"{s.uuid}::{n}" for s in small for n in range(4)}
        assert kubelet.options(SHARED) is not None and kubelet.options(SHARED).pre_start_required  # type: ignore[union-attr]

        one = pod(node, "one", 1)
        admitted = await kubelet.admit_pod(one["metadata"]["uid"], [ContainerRequest("main", {SHARED: 1})])
        got = admitted.container("main")
        (rid,) = got.device_ids[SHARED]
        mig_uuid = rid.split("::")[0]
        slot = next(s for s in small if s.uuid == mig_uuid)
        resp = got.responses[SHARED]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        assert resp.envs["LD_PRELOAD"].endswith("libvcuda.so") and resp.envs["VCUDA_LIMITS"] == "/etc/vcuda/limits"
        paths = [d.host_path for d in resp.devices]
        gi_node = 3 + 9 * (slot.gi or 0)  # mig-minors: GPU minor 3 first, gi<G> at 3 + 9G, its ci0 next
        assert paths[:4] == ["/dev/nvidia3", f"/dev/nvidia-caps/nvidia-cap{gi_node}",
                             f"/dev/nvidia-caps/nvidia-cap{gi_node + 1}", "/dev/nvidiactl"], paths
        vdir = Path(next(m.host_path for m in resp.mounts if m.container_path == "/etc/vcuda"))
        quarter = slot.memory_mib // 4
        assert resp.annotations["tencent.com/vcuda-memory"] == str(quarter << 20)
        # PreStartContainer wrote the container's own limits: a quarter of the instance's memory, on its MIG UUID
        limits = Limits.parse((vdir / "limits").read_text())
        assert limits.pod_uid == one["metadata"]["uid"] and limits.container_name == "main"
        assert [(d.uuid, d.memory_limit_bytes, d.compute) for d in limits.devices] == [(mig_uuid, quarter << 20, "gpm")]
        assert limits.core_limit == 25 and (vdir / "vcuda.sock").exists()
        holders = state.ledger.slot_holders[slot.name]
        (key,) = holders
        assert (holders[key].cores, holders[key].memory_mib) == (25, quarter)
        saved = CheckpointStore(node.workdir / "ckpt").load().snapshot.ledger
        assert saved.allocations[key].mig == slot.name and saved.allocations[key].pod == "one"  # named, written
        text = "\n".join(str(m) for m in mig_families(state.ledger, INV))
        assert "pod default/one" in text

        two = pod(node, "two", 2)  # two replicas: kept on one instance by GetPreferredAllocation
        admitted = await kubelet.admit_pod(two["metadata"]["uid"], [ContainerRequest("main", {SHARED: 2})])
        ids = admitted.container("main").device_ids[SHARED]
        assert len({i.split("::")[0] for i in ids}) == 1
        held = [a for a in state.ledger.allocations.values() if a.pod == "two"]
        assert [(a.cores, a.memory_mib) for a in held] == [(50, small[0].memory_mib // 2)]

        # replicas of two instances for one container: refused with the reason, nothing recorded
        before = dict(state.ledger.allocations)
        sock = node.workdir / "dp" / "gpumgr-mig-1g.10gb-shared.sock"
        async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pb_grpc.DevicePluginStub(ch).Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[f"{small[0].uuid}::3", f"{small[1].uuid}::3"])]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must be of one MIG instance" in (e.value.details() or "")
        assert state.ledger.allocations == before

        # the pod goes: its share is released at the next reconcile, its vDevice directory removed
        await kubelet.remove_pod(one["metadata"]["uid"])
        node.api.store.delete_pod("default", "one")
        await kubelet.wait_for(lambda: key not in state.ledger.allocations, 30)
        await kubelet.wait_for(lambda: not vdir.exists(), 30)
        assert [a.pod for a in state.ledger.allocations.values()] == ["two"]
    finally:
        await node.stop()


async def test_a_container_with_a_share_and_vcuda_units_gets_both(short_dir: Path):
    """The share the container already holds inside a MIG instance does not hide it from the vcuda Allocate that
    follows (the agent looks for pending containers asking vcuda-core; a MIG holding is another resource of theirs)."""
    node = make_node(short_dir)
    await node.start()
    try:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: len(kubelet.devices(SHARED)) == 8, 30)
        limits = {SHARED: "1", "tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4"}
        both = node.api.store.create_pod({
            "metadata": {"name": "both", "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": node.node_name, "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": dict(limits)}}]},
            "status": {"phase": "Pending"}})
        admitted = await kubelet.admit_pod(both["metadata"]["uid"], [ContainerRequest("main", {
            SHARED: 1, "tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 4})])
        got = admitted.container("main")
        assert len(got.device_ids[SHARED]) == 1 and len(got.device_ids["tencent.com/vcuda-core"]) == 50
        assert node.agent is not None and node.agent.state is not None
        held = sorted((a.mig is not None, a.cores) for a in node.agent.state.ledger.allocations.values())
        assert held == [(False, 50), (True, 25)]
    finally:
        await node.stop()


async def test_a_static_pods_share_is_named_after_its_mirror_pod(short_dir: Path):
    """The kubelet knows a static pod by its own UID, which its mirror pod in the API carries as
    kubernetes.io/config.mirror: PreStartContainer still finds the pod and writes its limits."""
    node = make_node(short_dir)
    await node.start()
    try:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: len(kubelet.devices(SHARED)) == 8, 30)
        kubelet_uid = "0123456789abcdef0123456789abcdef"  # the static pod's UID in the kubelet (a config hash)
        mirror = pod(node, "static-node-1", 1)
        mirror = node.api.store.merge_patch_pod("default", "static-node-1", {"metadata": {"annotations": {
            "kubernetes.io/config.mirror": kubelet_uid}}})
        admitted = await kubelet.admit_pod(kubelet_uid, [ContainerRequest("main", {SHARED: 1})])
        resp = admitted.container("main").responses[SHARED]
        vdir = Path(next(m.host_path for m in resp.mounts if m.container_path == "/etc/vcuda"))
        limits = Limits.parse((vdir / "limits").read_text())
        assert limits.pod_uid == mirror["metadata"]["uid"] and limits.container_name == "main"
    finally:
        await node.stop()
