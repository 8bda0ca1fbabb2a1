"""DRA with partitionable MIG devices: the slices (counters and devices, v1 fields, read by the kubernetes client's
models, within the API's limits) let no two overlapping placements be allocated together; NodePrepareResources
creates the instance at the allocated placement and returns its CDI device, NodeUnprepareResources destroys it;
kill -9 at every step of prepare and unprepare leaks no instance and loses no prepared claim."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.models import V1ResourceSliceSpec

from gpumgr.devices.fake_nvml_node import mig_minors_text
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.types import GPU, Inventory
from gpumgr.dra import mig_slices
from gpumgr.dra.mig_prepare import MigClaims, MigResult
from gpumgr.dra.slices import build_spec
from gpumgr.mig import node as mig_node
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState, load_checkpoint
from tests.mig.harness import Crash, CrashingBackend, Steps, recorded, truth
from tests.mig.test_restarts import hardware  # noqa: F401 - the fixture: simulated and fake-NVML cards

UID = "0b1c2d3e-0000-4000-8000-000000000001"


def h100s(n: int) -> Inventory:
    return Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-mig", minor=i, name="NVIDIA H100 80GB HBM3",
                                    memory_mib=81920) for i in range(n)),
                     levels=tuple(tuple("X" if a == b else "NV18" for b in range(n)) for a in range(n)))


def test_slices_counters_and_devices_per_v1(tmp_path: Path):
    inv = h100s(9)
    mig = SimulatedMig(inv, {i: "h100-80" for i in range(9)}, enabled=set(range(8)))  # card 8: MIG off
    base = build_spec(inv, "node-1", "gpu.gpumgr.io", {}, 256, 3)
    specs = mig_slices.build_slices(base, mig.cards(), inv)
    counters = [s for s in specs if "sharedCounters" in s]
    devs = [d for s in specs for d in s.get("devices", [])]
    assert len(counters) == 1 and len(counters[0]["sharedCounters"]) == 8
    assert all(len(s.get("devices", [])) <= 128 and ("devices" in s) != ("sharedCounters" in s) for s in specs)
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {len(specs)} and len(specs) == 3
    for s in specs:
        V1ResourceSliceSpec.from_dict(s)  # every field is one the v1 API has
    names = [d["name"] for d in devs]
    assert "gpu-8" in names and "gpu-0" not in names and len(names) == len(set(names)) == 1 + 8 * 18
    assert "gpu-0-mig-3g-40gb-9-4" in names and mig_slices.parse_device_name("gpu-0-mig-3g-40gb-9-4") == (0, 9, 4)
    three = next(d for d in devs if d["name"] == "gpu-0-mig-3g-40gb-9-4")
    used = three["consumesCounters"][0]["counters"]
    assert sorted(k for k in used if k.startswith("memory-slice")) == [f"memory-slice-{k}" for k in (4, 5, 6, 7)]
    card0 = [d for d in devs if d["name"].startswith("gpu-0-mig-")]
    for a, b in itertools.combinations(card0, 2):  # overlap <=> a shared memory-slice counter of capacity 1
        pa, pb = (mig_slices.parse_device_name(d["name"]) for d in (a, b))
        prof = {p.id: p for p in mig.cards()[0].profiles}
        sa, sb = pa[2], pb[2]  # type: ignore[index]
        overlap = sa < sb + prof[pb[1]].memory_slices and sb < sa + prof[pa[1]].memory_slices  # type: ignore[index]
        shared = {k for k in a["consumesCounters"][0]["counters"] if k.startswith("memory-slice")} & \
            {k for k in b["consumesCounters"][0]["counters"] if k.startswith("memory-slice")}
        assert overlap == bool(shared), (a["name"], b["name"])


class CrashingStore(CheckpointStore):
    def __init__(self, directory: Path, steps: Steps):
        super().__init__(directory)
        self.steps = steps

    def save(self, ledger: Any, node: str = "") -> int:
        self.steps.point()
        return super().save(ledger, node)


async def agent(tmp_path: Path, backend: Any, steps: Steps) -> tuple[NodeState, MigClaims]:
    inv = h100s(2)
    state = NodeState("node-1", inv, CrashingStore(tmp_path / "ckpt", steps))
    load_checkpoint(state)
    tmp_path.mkdir(parents=True, exist_ok=True)
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors_text([0, 1]))
    manager, _ = await mig_node.start(state, CrashingBackend(backend, steps))
    return state, MigClaims(state, manager, tmp_path / "cdi", minors, "node-1")


RESULTS = [MigResult("small", "gpu-0-mig-1g-10gb-19-3"), MigResult("big", "gpu-1-mig-3g-40gb-9-4")]


async def life(claims: MigClaims) -> None:
    names = await claims.prepare("ns", "claim", UID, "pod", "pod-uid", RESULTS)
    assert names == await claims.prepare("ns", "claim", UID, "pod", "pod-uid", RESULTS)  # a repeat: the same
    await claims.unprepare(UID)


async def test_prepare_creates_at_the_placement_and_unprepare_destroys(hardware: Callable[[], Any],  # noqa: F811
                                                                      tmp_path: Path):
    backend = hardware()
    state, claims = await agent(tmp_path, backend, Steps(None))
    try:
        names = await claims.prepare("ns", "claim", UID, "pod", "pod-uid", RESULTS)
        assert {(c, s, p) for c, s, p, _ in truth(backend)} == {(0, 3, "1g.10gb"), (1, 4, "3g.40gb")}
        spec = json.loads((tmp_path / "cdi" / f"gpumgr.io-vgpu_{UID}.json").read_text())
        small = state.ledger.slots["mig-0-3"]
        assert names[0] == f"gpumgr.io/vgpu=claim-{UID}-mig-0-3"
        edits = spec["devices"][0]["containerEdits"]
        assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={small.uuid}"]
        assert [n["path"] for n in edits["deviceNodes"]] == [
            "/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{3 + 9 * (small.gi or 0)}",
            f"/dev/nvidia-caps/nvidia-cap{4 + 9 * (small.gi or 0)}"]
        with pytest.raises(Exception, match="overlap mig-0-3"):  # the ledger backs the scheduler's counters up
            await claims.prepare("ns", "other", UID.replace("1", "2"), "p", "p-uid",
                                 [MigResult("x", "gpu-0-mig-1g-20gb-15-2")])
        assert await claims.unprepare(UID) == 2
        assert truth(backend) == set() and state.ledger.slots == {}
        assert not (tmp_path / "cdi" / f"gpumgr.io-vgpu_{UID}.json").exists()
    finally:
        state.close()


async def test_kill_9_at_every_step_of_prepare_and_unprepare(hardware: Callable[[], Any],  # noqa: F811
                                                             tmp_path: Path):
    finished = None
    for at in range(1, 60):
        run = tmp_path / f"run-{at}"
        died: list[NodeState] = []
        try:
            state, claims = await agent(run, hardware(), Steps(at))  # the start itself has crash points too
            died.append(state)
            await life(claims)
            finished = at
        except Crash:
            pass
        finally:
            for st in died:
                st.close()
        if finished:
            break
        backend = hardware()  # the restart: the same cards, a new agent
        state, claims = await agent(run, backend, Steps(None))
        try:
            assert recorded(state.ledger) == truth(backend), f"crash at step {at}"
            held = [k for k in state.ledger.allocations]
            if held:  # a prepared claim survives: still held, the kubelet's unprepare frees it
                assert all(state.ledger.slots[state.ledger.allocations[k].mig or ""].ready for k in held)
            await life(claims)  # the kubelet retries: prepare again, then unprepare
            assert truth(backend) == set() and state.ledger.slots == {} and state.ledger.allocations == {}
        finally:
            state.close()
    assert finished and finished > 8


async def test_a_claim_whose_second_device_fails_leaves_nothing(hardware: Callable[[], Any],  # noqa: F811
                                                                tmp_path: Path):
    backend = hardware()
    state, claims = await agent(tmp_path, backend, Steps(None))
    try:
        stray = backend.mig_create(1, 9, 4)  # made behind the agent's back, after its start-up pass
        with pytest.raises(Exception, match="occupied"):
            await claims.prepare("ns", "claim", UID, "pod", "pod-uid", RESULTS)  # card 1's 3g at 4 is taken
        assert {(c, s) for c, s, _, _ in truth(backend)} == {(1, 4)} and stray.uuid in str(truth(backend))
        assert state.ledger.slots == {} and state.ledger.allocations == {}  # the first device was taken back
        assert not (tmp_path / "cdi" / f"gpumgr.io-vgpu_{UID}.json").exists()
    finally:
        state.close()


async def test_a_cards_profiles_are_read_from_nvml_once_not_per_claim(hardware: Callable[[], Any],  # noqa: F811
                                                                      tmp_path: Path):
    state, claims = await agent(tmp_path, hardware(), Steps(None))
    reads = []
    read_cards = claims.manager.cards

    def counted() -> Any:
        reads.append(1)
        return read_cards()

    claims.manager.cards = counted  # type: ignore[method-assign]
    try:
        for _ in range(2):  # two claims' lives: four instances made and destroyed
            await life(claims)
        assert len(reads) == 1  # every card's MIG state (dozens of NVML calls) was read for each instance made
    finally:
        state.close()
