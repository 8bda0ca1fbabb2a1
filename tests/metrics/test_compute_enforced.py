"""`gpumgr_container_compute_limit_enforced` on `/metric`, over real HTTP: per container and device, whether its
compute limit is enforced and how (process, gpm, none), as the node's limits for it say. Shares inside MIG
instances of an H100 (GPM) and of an A100 (no GPM) next to a share of a whole card; the text passes
`promtool check metrics`."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpumgr.allocator.ledger import Ledger
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, Inventory
from gpumgr.metrics import usage
from gpumgr.node import limits as node_limits
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from tests.metrics.node import SimNode
from tests.metrics.scrape import absent, get, scrape, serving, value
from tests.metrics.test_status import gpumgr

NAME = "gpumgr_container_compute_limit_enforced"
NAMES = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
MIG_H = "MIG-11111111-2222-3333-4444-555555555501"
MIG_A = "MIG-11111111-2222-3333-4444-555555555502"
PROMTOOL = shutil.which("promtool")


def mig_node(tmp: Path) -> SimNode:
    node = SimNode(tmp, n_cards=3)
    inv = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", minor=i, name=n,
                                   memory_mib=81920, bus_id=f"0000:{i + 0x10:02x}:00.0")
                               for i, n in enumerate(NAMES)),
                    levels=tuple(tuple("X" if i == j else "SYS" for j in range(3)) for i in range(3)))
    node.inv = inv
    node.state = NodeState("node-a", inv, CheckpointStore(tmp / "ckpt-mig"))
    node.sim = SimulatedBackend(inv)
    node.backend = node.sim
    return node


async def add_instances(node: SimNode) -> None:
    def change(led: Ledger) -> None:
        for card, uuid in ((0, MIG_H), (1, MIG_A)):
            led.set_mig_mode(card, True)
            led.add_slot(MigSlot(card=card, start=0, size=4, profile_id=9, profile="3g.40gb", memory_mib=40192,
                                 gi=2, ci=0, uuid=uuid))

    await node.state.commit(change)


async def test_each_share_says_whether_and_how_its_compute_limit_is_enforced(tmp_path: Path):
    node = mig_node(tmp_path)
    await add_instances(node)
    await node.place("hopper", "main", (0,), cores=30, memory_mib=8192, pids=[101], mig="mig-0-0")
    await node.place("ampere", "main", (1,), cores=30, memory_mib=8192, pids=[201], mig="mig-1-0")
    await node.place("card", "main", (2,), cores=30, memory_mib=8192, pids=[301])
    async with serving(node) as server:
        s = await scrape(server)
        status, _, text = await get(server.url + "/metric")
    assert status == 200
    base = {"namespace": "ml", "node": "node-a", "container_name": "main"}
    h_uuid, a_uuid, c_uuid = (node.inv.gpus[i].uuid for i in range(3))
    assert value(s, NAME, pod_name="hopper", **base, uuid=MIG_H, enforced_by="gpm") == 1  # as the shim names it
    assert value(s, NAME, pod_name="ampere", **base, uuid=MIG_A, enforced_by="none") == 0
    assert value(s, NAME, pod_name="card", **base, uuid=c_uuid, enforced_by="process") == 1
    for pod in ("hopper", "ampere"):  # one series per device of the container, no other way claimed
        assert len([k for k in s if k[0] == NAME and ("pod_name", pod) in k[1]]) == 1
    assert {dict(k[1])["uuid"] for k in s if k[0] == NAME} == {c_uuid, MIG_H, MIG_A}
    if PROMTOOL is not None:
        family = "\n".join(ln for ln in text.splitlines() if NAME in ln) + "\n"
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=family, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


async def test_containers_without_a_compute_limit_have_no_series(tmp_path: Path):
    node = mig_node(tmp_path)
    await add_instances(node)
    await node.place("whole-instance", "main", (1,), cores=100, memory_mib=40192, pids=[501], mig="mig-1-0")
    await node.place("whole-card", "main", (2,), cores=100, memory_mib=81920, pids=[601])
    async with serving(node) as server:
        s = await scrape(server)
    assert absent(s, NAME)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_check_metrics_can_fail():
    bad = "# TYPE x_total gauge\nx_total 1\n"  # a gauge named like a counter
    result = subprocess.run([str(PROMTOOL), "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


async def test_gpumgr_status_names_the_shares_whose_compute_is_not_enforced(tmp_path: Path):
    node = mig_node(tmp_path)
    await add_instances(node)
    await node.place("hopper", "main", (0,), cores=30, memory_mib=8192, pids=[101], mig="mig-0-0")
    await node.place("ampere", "main", (1,), cores=30, memory_mib=8192, pids=[201], mig="mig-1-0")
    async with serving(node) as server:
        code, out, err = await gpumgr("status", "--addr", server.url)
        jcode, jout, _ = await gpumgr("status", "--addr", server.url, "--format", "json")
    assert code == 0 and jcode == 0, err
    (line,) = [ln for ln in out.splitlines() if "compute limit not enforced" in ln]
    assert "ml/ampere/main" in line and "hopper" not in line
    holders = {h["pod"]: h for h in json.loads(jout)["usage"]["holders"]}
    assert list(holders["hopper"]["compute_enforcement"].values()) == ["gpm"]
    assert list(holders["ampere"]["compute_enforcement"].values()) == ["none"]


async def test_limits_are_worked_out_again_only_when_a_share_or_its_pod_changed(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    node = mig_node(tmp_path)
    await add_instances(node)
    hopper = await node.place("hopper", "main", (0,), cores=30, memory_mib=8192, pids=[101], mig="mig-0-0")
    card = await node.place("card", "main", (2,), cores=30, memory_mib=8192, pids=[301])
    worked: list[str] = []
    real = node_limits.container_limits

    def counted(inventory: Inventory, unit_mib: int, alloc: Any, pod: Any) -> Any:
        worked.append(alloc.key)
        return real(inventory, unit_mib, alloc, pod)

    monkeypatch.setattr(node_limits, "container_limits", counted)
    monkeypatch.setattr(usage, "container_limits", counted, raising=False)  # where the reader called it before
    reader = node.reader()
    for _ in range(5):  # five scrapes, nothing changed
        snap = reader.snapshot()
    assert sorted(worked) == sorted([hopper, card])  # before: five times each
    assert {h.pod: h.compute_enforcement for h in snap.holders} == {
        "hopper": {MIG_H: "gpm"}, "card": {node.inv.gpus[2].uuid: "process"}}

    uid = node.uids["card"]
    node.pods[uid] = copy.deepcopy(node.pods[uid])  # the pod cache replaces a pod whole when it changes
    await node.state.commit(lambda led: led.release(hopper))
    snap = reader.snapshot()
    assert sorted(worked) == sorted([hopper, card, card])
    assert {h.pod: h.compute_enforcement for h in snap.holders} == {"card": {node.inv.gpus[2].uuid: "process"}}
