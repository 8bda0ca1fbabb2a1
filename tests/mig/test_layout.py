"""Static MIG layouts through the real nvidia-ml-py over the fake NVML: named and configured layouts applied,
changed by label, refused (with the reason) on cards something holds, on Ampere cards waiting for a reset, and
when they do not fit; a start adopts instances the layout wants and destroys the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumgr.allocator import Allocation
from gpumgr.devices.types import GPU, Inventory
from gpumgr.mig import layout as lay
from gpumgr.mig.apply import apply_layout, keeper
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.mig.harness import Node, Steps, nvml_lives, recorded, truth

INV = Inventory(gpus=(GPU(index=0, uuid="GPU-00000000-h100", minor=0, name="NVIDIA H100 80GB HBM3", memory_mib=81920),
                      GPU(index=1, uuid="GPU-00000001-a100", minor=1, name="NVIDIA A100-SXM4-40GB", memory_mib=40960),
                      GPU(index=2, uuid="GPU-00000002-t4", minor=2, name="Tesla T4", memory_mib=15360)),
                levels=(("X", "SYS", "SYS"), ("SYS", "X", "SYS"), ("SYS", "SYS", "X")))
CONFIGURED = {"two-halves": {"0": ["3g.40gb", "3g.40gb"], "1": ["3g.20gb", "3g.20gb"]},
              "too-much": {"0": ["4g.40gb", "4g.40gb"]}}


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeNvmlNode, Any]]:
    nvml_node.build()
    node = FakeNvmlNode(tmp_path / "fake", INV, mig={0: "h100-80", 1: "a100-40"}, mig_on=(0,)).write()
    monkeypatch.setenv(nvml_node.ENV, str(node.spec))
    with nvml_lives(tmp_path) as restart:
        yield node, restart


def agent(tmp_path: Path, backend: Any, name: str | None) -> Node:
    node = Node(tmp_path / "ckpt", [g.memory_mib for g in INV.gpus], backend, Steps(None))
    node.mig.reconcile(keeper(node.mig, lay.parse(name, CONFIGURED) if name else None))
    return node


def profiles_on(node: Node, card: int) -> list[tuple[str, int]]:
    return sorted((s.profile, s.start) for s in node.ledger.slots.values() if s.card == card)


def test_parse_names_and_refusals():
    assert lay.parse("all-1g.10gb").fill == "1g.10gb"
    assert lay.parse("two-halves", CONFIGURED).cards["0"] == ("3g.40gb", "3g.40gb")
    assert lay.chosen({lay.LABEL: "all-balanced"}, "all-1g.10gb") == "all-balanced"
    assert lay.chosen({}, "all-1g.10gb") == "all-1g.10gb"
    with pytest.raises(lay.LayoutError, match="unknown MIG layout 'half'; known: all-<profile>"):
        lay.parse("half")
    with pytest.raises(lay.LayoutError, match="layout name"):
        lay.parse("a b")
    with pytest.raises(lay.LayoutError, match="neither \"all\" nor a card index"):
        lay.parse("x", {"x": {"first": ["1g.10gb"]}})
    with pytest.raises(lay.LayoutError, match="list of at most 16"):
        lay.parse("x", {"x": {"0": "1g.10gb"}})


def test_named_layout_applied_changed_and_refused_with_reasons(fake: tuple[FakeNvmlNode, Any], tmp_path: Path):
    hw, restart = fake
    node = agent(tmp_path, restart(), "all-1g.10gb")
    report = apply_layout(node.mig, lambda: node.ledger, lay.parse("all-1g.10gb", CONFIGURED))
    assert profiles_on(node, 0) == [("1g.10gb", s) for s in range(7)]
    # the A100-40 has 1g.10gb too (its two-memory-slice 1g), but MIG was off: asked on, pending a reset
    assert report.refused == ["layout all-1g.10gb: card 1: MIG mode is pending until the GPU is reset (Ampere): "
                              "reset it (nvidia-smi -r) and the layout is applied at the agent's next start"]
    assert recorded(node.ledger) == truth(node.mig)
    # a share inside one instance: that card's layout may not change now
    first = node.ledger.slots["mig-0-0"]
    node.commit(lambda led: led.assign(Allocation(key="a" + "3" * 24, cards=(0,), cores=50, memory_mib=1024,
                                                  mig=first.name)))
    report = apply_layout(node.mig, lambda: node.ledger, lay.parse("two-halves", CONFIGURED))
    assert report.refused[0].startswith("layout two-halves: card 0: MIG instance mig-0-0 is in use by a333")
    assert "card 1: MIG mode is pending until the GPU is reset" in report.refused[1]  # Ampere, MIG was off
    assert profiles_on(node, 0) == [("1g.10gb", s) for s in range(7)]
    node.commit(lambda led: led.release("a" + "3" * 24))
    hw.reset(1)
    report = apply_layout(node.mig, lambda: node.ledger, lay.parse("two-halves", CONFIGURED))
    assert report.refused == []
    assert profiles_on(node, 0) == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert profiles_on(node, 1) == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert recorded(node.ledger) == truth(node.mig)
    report = apply_layout(node.mig, lambda: node.ledger, lay.parse("too-much", CONFIGURED))
    assert report.refused == ["layout too-much: card 0: 4g.40gb, 4g.40gb does not fit (4g.40gb has no compute "
                              "slices left)"]
    assert profiles_on(node, 0) == [("3g.40gb", 0), ("3g.40gb", 4)]  # nothing touched


def test_a_restart_adopts_what_the_layout_wants_and_destroys_the_rest(fake: tuple[FakeNvmlNode, Any],
                                                                       tmp_path: Path):
    _, restart = fake
    backend = restart()
    for start in (0, 4):  # left by an agent whose checkpoint directory was lost
        backend.mig_create(0, 9, start)
    node = agent(tmp_path, restart(), "two-halves")
    assert profiles_on(node, 0) == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert {s.origin for s in node.ledger.slots.values()} == {"adopted"}
    node2 = Node(tmp_path / "other", [g.memory_mib for g in INV.gpus], restart(), Steps(None))
    node2.mig.reconcile()  # no layout wants them: destroyed, never left running unseen
    assert truth(node2.mig) == set() and node2.ledger.slots == {}
