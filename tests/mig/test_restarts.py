"""kill -9 at every step of making and unmaking MIG instances: a restart from the checkpoint, reconciled against
what the card says exists, ends with the ledger equal to the truth (no instance leaked, none recorded that does
not exist), over the simulated backend and over the real nvidia-ml-py on the fake NVML."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, Inventory
from gpumgr.mig.types import MigError
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.mig.harness import Crash, Node, Steps, nvml_lives, recorded, truth

INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-mig", minor=i, name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920) for i in range(2)),
                levels=(("X", "NV18"), ("NV18", "X")))
Hardware = Callable[[], Any]  # a new backend over the same cards (an agent restart)


@pytest.fixture(params=["simulated", "fake-nvml"])
def hardware(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hardware]:
    if request.param == "simulated":
        mig = SimulatedMig(INV, {0: "h100-80", 1: "h100-80"}, enabled={0, 1})
        yield lambda: SimulatedBackend(INV, mig)
        return
    nvml_node.build()
    node = FakeNvmlNode(tmp_path / "fake", INV, mig={0: "h100-80", 1: "h100-80"}, mig_on=(0, 1)).write()
    monkeypatch.setenv(nvml_node.ENV, str(node.spec))
    with nvml_lives(tmp_path) as open_backend:  # the old agent is gone: its NVML session with it
        yield open_backend


def scenario(node: Node) -> None:
    """Make two instances, place a share inside one, release it, unmake it, make another there."""
    node.mig.reconcile()
    a = node.mig.create(0, "1g.10gb", 0)
    node.mig.create(0, "3g.40gb", 4)
    node.commit(lambda led: led.assign(Allocation(key="a" + "0" * 24, cards=(0,), cores=50, memory_mib=4096,
                                                  mig=a.name)))
    node.commit(lambda led: led.release("a" + "0" * 24))
    node.mig.destroy(a.name)
    node.mig.create(0, "2g.20gb", 0)
    node.mig.create(1, "7g.80gb", 0)


def test_kill_9_at_every_step_reconciles_to_the_truth(hardware: Hardware, tmp_path: Path):
    steps_done = []
    for at in range(1, 100):
        ckpt = tmp_path / f"ckpt-{at}"
        try:
            scenario(Node(ckpt, [81920, 81920], hardware(), Steps(at)))
        except Crash:
            pass
        else:
            steps_done.append(at)
            break
        backend = hardware()  # the restart: a new agent, the same cards
        node = Node(ckpt, [81920, 81920], backend, Steps(None))
        node.mig.reconcile()
        assert recorded(node.ledger) == truth(backend), f"crash at step {at}"
        assert all(s.ready for s in node.ledger.slots.values())
        again = Node(ckpt, [81920, 81920], hardware(), Steps(None))  # and the checkpoint says so too
        assert recorded(again.ledger) == recorded(node.ledger)
        for c in backend.mig_cards():  # clean cards for the next round
            for i in c.instances:
                backend.mig_destroy(i.card, i.gi)
    assert steps_done and steps_done[0] > 10  # the scenario has that many crash points, each was tried


def test_an_instance_nobody_recorded_is_destroyed_and_a_lost_one_forgotten(hardware: Hardware, tmp_path: Path):
    backend = hardware()
    stray = backend.mig_create(0, 19, 6)  # e.g. made by hand, or by an agent whose checkpoint was lost
    node = Node(tmp_path / "c", [81920, 81920], backend, Steps(None))
    kept = node.mig.create(1, "1g.10gb", 3)
    backend.mig_destroy(1, kept.gi or 0)  # someone destroyed it behind the agent's back
    node.commit(lambda led: None)
    node = Node(tmp_path / "c", [81920, 81920], hardware(), Steps(None))
    plan = node.mig.reconcile()
    assert [(i.card, i.start) for i in plan.destroy] == [(0, 6)] and stray.uuid not in str(truth(backend))
    assert [s.name for s in plan.forget] == ["mig-1-3"] and node.ledger.slots == {}


def test_ledger_rules_for_cards_with_instances(hardware: Hardware, tmp_path: Path):
    node = Node(tmp_path / "c", [81920, 81920], hardware(), Steps(None))
    node.mig.reconcile()
    slot = node.mig.create(0, "3g.40gb", 0)
    led = node.ledger
    assert led.card(0).mode == "mig" and led.card(0).free_cores == 0
    with pytest.raises(LedgerError, match="MIG mode"):  # no whole-card or fractional request outside instances
        led.copy().assign(Allocation(key="a" + "1" * 24, cards=(0,), cores=30, memory_mib=1024))
    with pytest.raises(LedgerError, match="has 40704 MiB free"):  # a share inside is bounded by the instance
        led.copy().assign(Allocation(key="a" + "1" * 24, cards=(0,), cores=30, memory_mib=50000, mig=slot.name))
    node.commit(lambda led: led.assign(Allocation(key="a" + "1" * 24, cards=(0,), cores=30, memory_mib=8192,
                                                  mig=slot.name)))
    with pytest.raises(LedgerError, match="shared"):
        node.ledger.copy().assign(Allocation(key="a" + "2" * 24, cards=(0,), cores=100, mig=slot.name))
    with pytest.raises(LedgerError, match="held by"):  # a held instance is not destroyed
        node.mig.destroy(slot.name)
    with pytest.raises(LedgerError, match="overlap mig-0-0"):  # the ledger refuses an overlapping placement
        node.mig.create(0, "1g.10gb", 2)
    backend = hardware()
    backend.mig_create(0, 19, 4)  # made behind the ledger's back
    node.mig = type(node.mig)(backend, node.commit, lambda: node.ledger)
    with pytest.raises(MigError, match="occupied"):  # NVML refuses; the slot in flight is taken back
        node.mig.create(0, "3g.40gb", 4)
    assert sorted(node.ledger.slots) == ["mig-0-0"]
    doc = node.ledger.to_json()
    assert Ledger.from_json(doc).slots == node.ledger.slots  # round trip through the checkpoint format
