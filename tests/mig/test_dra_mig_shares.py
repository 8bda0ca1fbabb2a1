"""Fractional shares inside a MIG instance through DRA: MIG devices are multi-allocatable with consumable `cores` and
`memory` (valid per the v1 models and the Kubernetes OpenAPI schema); the scheduler stand-in consumes a shared
device's counters once, as kube-scheduler does; NodePrepareResources of the first share makes the instance, later
shares join it, each with its memory limit (limits file, vDevice server, CDI spec with the shim and the MIG UUID);
a share that does not fit is refused with nothing changed; the instance goes with its last holder; kill -9 at every
step (checkpoint writes and NVML changes) of two shares' lives loses nothing and leaks no instance. Over the
simulated backend and the real nvidia-ml-py on the fake NVML."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes.client.models import V1ResourceSliceSpec

from gpumgr.devices.fake_nvml_node import mig_minors_text
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.dra import mig_slices
from gpumgr.dra.claims import ClaimError
from gpumgr.dra.config import DraConfig
from gpumgr.dra.mig_prepare import MigClaims, MigResult, mig_results_of
from gpumgr.dra.mig_shares import ShareSupport
from gpumgr.dra.slices import build_spec
from gpumgr.mig import node as mig_node
from gpumgr.node.claims import vdevice_key
from gpumgr.node.state import NodeState, load_checkpoint
from gpumgr.sim.dra_scheduler import DraScheduler, Unschedulable
from gpumgr.sim.kubeapi import KubeStore
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.limits import Limits
from gpumgr.vdevice.server import VDeviceManager
from tests.mig.harness import Crash, CrashingBackend, Steps, recorded, truth
from tests.mig.test_dra_mig import CrashingStore, h100s
from tests.mig.test_restarts import hardware  # noqa: F401 - the fixture: simulated and fake-NVML cards

GIB = 2**30
A = "0b1c2d3e-0000-4000-8000-00000000000a"
B = "0b1c2d3e-0000-4000-8000-00000000000b"
C = "0b1c2d3e-0000-4000-8000-00000000000c"
THREE_G = "gpu-0-mig-3g-40gb-9-4"  # H100: 3g.40gb (profile id 9) at memory slice 4


def share(cores: int, gib: int, device: str = THREE_G) -> list[MigResult]:
    return [MigResult("gpu", device, cores=cores, memory_bytes=gib * GIB, share_id="s")]


# -- slices ---------------------------------------------------------------------------------------------------------
def mig_specs() -> list[dict[str, Any]]:
    inv = h100s(2)
    mig = SimulatedMig(inv, {0: "h100-80", 1: "h100-80"}, enabled={0})
    return mig_slices.build_slices(build_spec(inv, "node-1", "vgpu.gpumgr.io", {}, 256, 1), mig.cards(), inv, None,
                                   256)


def test_mig_devices_are_multi_allocatable_with_cores_and_memory():
    specs = mig_specs()
    devs = {d["name"]: d for s in specs for d in s.get("devices", [])}
    three = devs[THREE_G]
    assert three["allowMultipleAllocations"] is True
    assert three["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}
    memory = three["capacity"]["memory"]
    assert memory["value"] == memory["requestPolicy"]["default"] == memory["requestPolicy"]["validRange"]["max"]
    assert memory["requestPolicy"]["validRange"]["step"] == "256Mi"
    assert set(three["capacity"]) == {"cores", "memory"}  # no capacity a share would take whole by default
    assert three["attributes"]["multiprocessors"]["int"] > 0
    assert three["consumesCounters"]  # the counters still keep placements apart
    for s in specs:
        V1ResourceSliceSpec.from_dict(s)


@pytest.mark.parametrize("version", [kubernetes_validate.latest_version()])
def test_mig_slices_validate_against_the_kubernetes_schema(version: str):
    for n, spec in enumerate(mig_specs()):
        if "sharedCounters" in spec and tuple(map(int, version.split(".")[:2])) < (1, 35):
            continue  # counter slices of their own are a 1.35 shape
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"s-{n}"},
                "spec": spec}
        kubernetes_validate.validate(body, version, strict=True)


# -- the scheduler stand-in -------------------------------------------------------------------------------------
def scheduler_with_slices() -> tuple[DraScheduler, KubeStore]:
    store = KubeStore()
    store.create_object("deviceclasses", {"metadata": {"name": "mig"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.attributes["vgpu.gpumgr.io"].type == "mig"'}}]}})
    for n, spec in enumerate(mig_specs()):
        store.create_object("resourceslices", {"metadata": {"name": f"node-1-{n}"}, "spec": spec})
    return DraScheduler(store), store


def share_claim(store: KubeStore, name: str, profile: str, capacity: dict[str, str] | None) -> None:
    exactly: dict[str, Any] = {"deviceClassName": "mig", "selectors": [{"cel": {
        "expression": f'device.attributes["vgpu.gpumgr.io"].profile == "{profile}"'}}]}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    store.create_object("resourceclaims", {"metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": exactly}]}}}, "default")


def result(claim: dict[str, Any]) -> dict[str, Any]:
    [r] = claim["status"]["allocation"]["devices"]["results"]
    return dict(r)


def test_shares_of_one_device_consume_its_counters_once():
    sched, store = scheduler_with_slices()
    for name in ("a", "b"):
        share_claim(store, name, "7g.80gb", {"memory": "20Gi", "cores": "40"})
    a, b = (result(sched.allocate_claim("default", n, "node-1")) for n in ("a", "b"))
    # the second share lands on the same instance: its memory slices (capacity 1 each) are not counted twice
    assert a["device"] == b["device"] == "gpu-0-mig-7g-80gb-0-0" and a["shareID"] != b["shareID"]
    assert a["consumedCapacity"] == {"memory": "20Gi", "cores": "40"}
    share_claim(store, "c", "7g.80gb", {"memory": "20Gi", "cores": "40"})  # 120 cores: more than the instance
    with pytest.raises(Unschedulable, match="no set of devices"):
        sched.allocate_claim("default", "c", "node-1")
    share_claim(store, "whole", "1g.10gb", None)  # the 7g's counters are taken: no other instance fits
    with pytest.raises(Unschedulable):
        sched.allocate_claim("default", "whole", "node-1")


def test_a_claim_asking_no_capacity_takes_the_whole_instance():
    sched, store = scheduler_with_slices()
    share_claim(store, "whole", "3g.40gb", None)
    r = result(sched.allocate_claim("default", "whole", "node-1"))
    assert r["consumedCapacity"]["cores"] == "100"
    share_claim(store, "more", "3g.40gb", {"memory": "4Gi", "cores": "10"})
    got = result(sched.allocate_claim("default", "more", "node-1"))
    assert got["device"] != r["device"]  # the whole one has no cores left: the other 3g placement


# -- prepare / unprepare -----------------------------------------------------------------------------------------
class Agent:
    """One agent life over a checkpoint directory: NodeState, the MIG manager after its start-up pass, MigClaims
    with vDevice support (limits files and servers under `root/vm`)."""

    def __init__(self, root: Path, backend: Any, steps: Steps, vm: Path):
        self.root, self.backend, self.steps, self.vm = root, backend, steps, vm  # vm: short (socket paths)
        self.state: NodeState | None = None
        self.vdevices: VDeviceManager | None = None

    async def start(self) -> MigClaims:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state = NodeState("node-1", h100s(2), CrashingStore(self.root / "ckpt", self.steps))
        load_checkpoint(self.state)
        minors = self.root / "mig-minors"
        minors.write_text(mig_minors_text([0, 1]))
        manager, _ = await mig_node.start(self.state, CrashingBackend(self.backend, self.steps))
        layout = VDeviceLayout(self.vm)
        self.vdevices = VDeviceManager(layout)
        cfg = DraConfig(node_name="node-1", cdi_dir=self.root / "cdi", dev_root=self.root / "dev")
        return MigClaims(self.state, manager, cfg.cdi_dir, minors, "node-1", ShareSupport(cfg, layout, self.vdevices))

    async def stop(self) -> None:
        if self.vdevices is not None:
            await self.vdevices.stop_all()
        if self.state is not None:
            self.state.close()

    def limits(self, uid: str) -> Limits:
        return Limits.parse((self.vm / vdevice_key(uid) / "limits").read_text())

    def spec(self, uid: str) -> dict[str, Any]:
        return dict(json.loads((self.root / "cdi" / f"gpumgr.io-vgpu_{uid}.json").read_text()))


@pytest.fixture
def vm_root() -> Iterator[Path]:
    """vDevice directories under a short path: a unix socket path has at most 107 bytes."""
    root = Path(tempfile.mkdtemp(prefix="gpumgr-vm-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def running(hardware: Callable[[], Any], tmp_path: Path,  # noqa: F811
                  vm_root: Path) -> AsyncIterator[tuple[Agent, MigClaims]]:
    agent = Agent(tmp_path, hardware(), Steps(None), vm_root)
    claims = await agent.start()
    yield agent, claims
    await agent.stop()


async def test_two_shares_live_in_one_instance_with_their_memory_limits(running: tuple[Agent, MigClaims]):
    agent, claims = running
    state = agent.state
    assert state is not None
    names_a = await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 4))
    await claims.prepare("ns", "b", B, "pod-b", "pod-b-uid", share(30, 8))
    assert {(c, s, p) for c, s, p, _ in truth(agent.backend)} == {(0, 4, "3g.40gb")}  # one instance, made once
    slot = state.ledger.slots["mig-0-4"]
    assert sorted(state.ledger.slot_holders["mig-0-4"]) == [f"dra/{A}/0", f"dra/{B}/0"]
    assert names_a == [f"gpumgr.io/vgpu=claim-{A}-mig-0-4"]
    for uid, cores, gib, pod in ((A, 50, 4, "pod-a-uid"), (B, 30, 8, "pod-b-uid")):
        limits = agent.limits(uid)
        assert (limits.pod_uid, limits.core_limit, limits.hard_limit) == (pod, cores, True)
        [dev] = limits.devices
        assert (dev.uuid, dev.index, dev.memory_limit_bytes) == (slot.uuid, 0, gib * GIB)
        assert dev.compute == "gpm"  # inside an H100's instance: GPM, not per-process figures
        assert vdevice_key(uid) in (agent.vdevices.running() if agent.vdevices else {})
        spec = agent.spec(uid)
        env = spec["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={slot.uuid}" in env and any(e.startswith("LD_PRELOAD=") for e in env)
        assert any(m["containerPath"] == "/etc/vcuda" and m["hostPath"] == str(agent.vm / vdevice_key(uid))
                   for m in spec["containerEdits"]["mounts"])
        [device] = spec["devices"]
        nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        assert nodes[0] == "/dev/nvidia0" and len(nodes) == 3 and all("nvidia-caps" in n for n in nodes[1:])
    # a repeat of a prepared share: the same device, nothing made
    assert await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 4)) == names_a
    assert len(truth(agent.backend)) == 1

    before = dict(state.ledger.allocations)
    with pytest.raises(ClaimError, match=r"claim ns/c does not fit in MIG instance mig-0-4.*20 free cores, 30"):
        await claims.prepare("ns", "c", C, "pod-c", "pod-c-uid", share(30, 4))
    with pytest.raises(ClaimError, match=r"claim ns/c does not fit in MIG instance mig-0-4.*MiB free"):
        await claims.prepare("ns", "c", C, "pod-c", "pod-c-uid", share(10, 30))
    with pytest.raises(ClaimError, match="a whole-instance request needs it free"):
        await claims.prepare("ns", "c", C, "pod-c", "pod-c-uid", [MigResult("gpu", THREE_G)])
    assert state.ledger.allocations == before and not (agent.root / "cdi" / f"gpumgr.io-vgpu_{C}.json").exists()

    assert await claims.unprepare(A) == 1
    assert len(truth(agent.backend)) == 1 and "mig-0-4" in state.ledger.slots  # b still lives there
    assert not (agent.root / "cdi" / f"gpumgr.io-vgpu_{A}.json").exists()
    assert await claims.unprepare(B) == 1
    assert truth(agent.backend) == set() and state.ledger.slots == {} and state.ledger.allocations == {}
    assert agent.vdevices is not None and agent.vdevices.running() == {}


async def test_a_share_larger_than_the_instance_makes_nothing(running: tuple[Agent, MigClaims]):
    agent, claims = running
    with pytest.raises(ClaimError, match=r"does not fit in MIG instance mig-0-4 \(3g.40gb"):
        await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 60))
    assert truth(agent.backend) == set() and agent.state is not None and agent.state.ledger.slots == {}


async def test_a_share_reserved_for_two_pods_is_refused(running: tuple[Agent, MigClaims]):
    agent, claims = running
    with pytest.raises(ClaimError, match="reserved for 2 pods"):
        await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 4), pods=2)
    assert truth(agent.backend) == set() and agent.state is not None and agent.state.ledger.allocations == {}


def test_results_with_bad_consumed_capacity_are_refused_with_the_claim_named():
    def claim(consumed: Any) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "x", "uid": A}, "status": {"allocation": {"devices": {
            "results": [{"driver": "d.io", "pool": "node-1", "device": THREE_G, "request": "gpu",
                         "consumedCapacity": consumed}]}}}}

    [got] = mig_results_of(claim({"cores": "40", "memory": "4Gi"}), "d.io", "node-1")
    assert (got.cores, got.memory_bytes) == (40, 4 * GIB)
    for bad, why in (({"cores": "0"}, "outside 1..100"), ({"memory": "-1"}, "not a positive"),
                     ({"multiprocessors": "3"}, "does not publish"), ({"cores": "lots"}, "consumedCapacity"),
                     ("x", "must be an object")):
        with pytest.raises(ClaimError, match=f"claim ns/x: device {THREE_G}.*{why}"):
            mig_results_of(claim(bad), "d.io", "node-1")


def test_a_share_id_that_is_not_a_dns_label_is_refused_not_cut():
    def claim(share: Any) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "x", "uid": A}, "status": {"allocation": {"devices": {
            "results": [{"driver": "d.io", "pool": "node-1", "device": THREE_G, "request": "gpu", "shareID": share,
                         "consumedCapacity": {"cores": "40", "memory": "4Gi"}}]}}}}

    longest = "a" * 63
    assert [r.share_id for r in mig_results_of(claim(longest), "d.io", "node-1")] == [longest]
    uid = "0b1c2d3e-0000-4000-8000-00000000000f"  # what kube-scheduler writes
    assert [r.share_id for r in mig_results_of(claim(uid), "d.io", "node-1")] == [uid]
    for bad in ("a" * 64, "a" * 63 + "b", "-x", "a b", 7):  # before: cut to 63 characters (two shares made one)
        with pytest.raises(ClaimError, match=f"claim ns/x: device '{THREE_G}': shareID .* is not a DNS label"):
            mig_results_of(claim(bad), "d.io", "node-1")


# -- kill -9 at every step ------------------------------------------------------------------------------------------
async def life(claims: MigClaims) -> None:
    """Two shares of one instance: prepared (and prepared again, as the kubelet may), then unprepared one by one."""
    await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 4))
    await claims.prepare("ns", "b", B, "pod-b", "pod-b-uid", share(30, 8))
    await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 4))
    await claims.unprepare(A)
    await claims.unprepare(B)


async def test_kill_9_at_every_step_of_two_shares(hardware: Callable[[], Any], tmp_path: Path,  # noqa: F811
                                                   vm_root: Path):
    finished = None
    for at in range(1, 80):
        run = tmp_path / f"run-{at}"
        vm = vm_root / str(at)
        first = Agent(run, hardware(), Steps(at), vm)  # the start itself has crash points too
        try:
            await life(await first.start())
            finished = at
        except Crash:
            pass
        finally:
            await first.stop()
        if finished:
            break
        again = Agent(run, hardware(), Steps(None), vm)  # the restart: the same cards, a new agent
        claims = await again.start()
        try:
            state = again.state
            assert state is not None
            assert recorded(state.ledger) == truth(again.backend), f"crash at step {at}"
            for k, a in state.ledger.allocations.items():  # a prepared share survives, in a made instance
                assert state.ledger.slots[a.mig or ""].ready, (at, k)
            await life(claims)  # the kubelet retries: prepare again, then unprepare
            assert truth(again.backend) == set() and state.ledger.slots == {} and state.ledger.allocations == {}
        finally:
            await again.stop()
    assert finished and finished > 8


async def test_after_a_restart_without_the_api_a_share_gets_its_server_back(hardware: Callable[[], Any],  # noqa: F811
                                                                            tmp_path: Path, vm_root: Path):
    first = Agent(tmp_path, hardware(), Steps(None), vm_root)
    claims = await first.start()
    await claims.prepare("ns", "a", A, "pod-a", "pod-a-uid", share(50, 4))
    before = first.limits(A)
    await first.stop()  # the agent dies; the kubelet has not unprepared
    again = Agent(tmp_path, hardware(), Steps(None), vm_root)
    claims = await again.start()
    try:
        assert again.vdevices is not None and again.vdevices.running() == {}
        await claims.restart_servers(A)  # what the DRA recovery does when the API cannot be listed
        assert vdevice_key(A) in again.vdevices.running() and again.limits(A) == before
        assert before.devices[0].memory_limit_bytes == 4 * GIB
    finally:
        await again.stop()
