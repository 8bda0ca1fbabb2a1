"""The DRA publisher builds the MIG counter sets and devices again only when what they come from changed (the MIG
cards, the static layout's instances, the cards' health), not at every ledger change: the shares of a card with MIG
off come and go with every claim, and each used to rebuild every (profile, placement) device of every MIG card."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpumgr.allocator import Allocation
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.dra import mig_slices
from gpumgr.dra.config import DraConfig
from gpumgr.dra.publisher import SlicePublisher
from gpumgr.mig import node as mig_node
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from tests.mig.test_dra_mig import h100s


def names(specs: list[dict[str, Any]]) -> set[str]:
    return {d["name"] for s in specs for d in s.get("devices", [])}


def mig_devices(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in specs for d in s.get("devices", []) if d["name"].startswith("gpu-0-mig-")]


async def test_mig_devices_are_built_again_only_when_the_mig_part_changed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    inv = h100s(2)
    state = NodeState("node-1", inv, CheckpointStore(tmp_path / "ckpt"))
    manager, _ = await mig_node.start(state, SimulatedBackend(inv, SimulatedMig(inv, {0: "h100-80"}, enabled={0})))
    built: list[int] = []
    devices = mig_slices.devices

    def counted(card: Any, *args: Any) -> list[dict[str, Any]]:
        built.append(card.index)
        return devices(card, *args)

    monkeypatch.setattr(mig_slices, "devices", counted)
    pub = SlicePublisher(DraConfig(node_name="node-1"), state, kube=None)  # type: ignore[arg-type]
    pub.mig_cards = manager.cards()
    first = pub.wanted_all(0)
    assert built == [0] and "gpu-0-mig-3g-40gb-9-4" in names(first) and "gpu-1" in names(first)

    for k in range(5):  # shares of card 1 (MIG off) come and go: a ledger change each
        key = f"a{k:024d}"
        await state.commit(lambda led, key=key: led.assign(Allocation(key=key, cards=(1,), cores=10,
                                                                       memory_mib=1024)))
        assert mig_devices(pub.wanted_all(0)) == mig_devices(first)  # the MIG card's devices as they were
        await state.commit(lambda led, key=key: led.release(key))
        pub.wanted_all(0)
    assert built == [0]  # before: one build per call, 11

    await asyncio.to_thread(manager.create, 0, "3g.40gb", 0, "layout")  # the static layout's: not for claims
    after = pub.wanted_all(0)
    assert built == [0, 0]
    assert "gpu-0-mig-3g-40gb-9-0" not in names(after) and "gpu-0-mig-3g-40gb-9-4" in names(after)

    await state.set_reason(0, "xid 79", True)  # the card's health: its devices get the taint
    tainted = mig_devices(pub.wanted_all(0))
    assert built == [0, 0, 0] and all(d.get("taints") for d in tainted)
    pub.wanted_all(0)
    assert built == [0, 0, 0]
    await state.set_reason(0, "xid 79", False)
    monkeypatch.undo()  # what the publisher shows is what the cards, built from scratch, give
    (card,) = [replace(c, profiles=tuple(replace(p, starts=tuple(st for st in p.starts if st >= 4))
                                         for p in c.profiles)) for c in manager.cards() if c.enabled]
    assert pub.wanted_all(0) == after == mig_slices.build_slices(pub.wanted(0), [card], inv)
