"""MIG node labels as GPU Feature Discovery names them, and the patch that keeps them current: a profile the
layout no longer has loses its labels, the operator's nvidia.com/mig.config is never touched."""

from __future__ import annotations

from gpumgr.allocator import Ledger
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.types import GPU, Inventory
from gpumgr.mig.labels import mig_labels, owned
from gpumgr.node.labels import GAIA_MODEL_LABEL, labels_patch

INV = Inventory(gpus=(GPU(index=0, uuid="GPU-0", minor=0, name="NVIDIA A100-SXM4-40GB", memory_mib=40960),),
                levels=(("X",),))


def ledger_with(*profiles: tuple[str, int, int, int]) -> Ledger:
    led = Ledger([40960])
    for name, pid, start, size in profiles:
        led.add_slot(MigSlot(card=0, start=start, size=size, profile_id=pid, profile=name, memory_mib=1,
                             gi=start + 1, ci=0, uuid=f"MIG-{start}"))
    return led


def test_labels_and_their_patch():
    cards = SimulatedMig(INV, {0: "a100-40"}, {0}).cards()
    two = mig_labels(cards, ledger_with(("3g.20gb", 9, 0, 4), ("3g.20gb", 9, 4, 4)), refused=False)
    assert two["nvidia.com/mig-3g.20gb.count"] == "2" and two["nvidia.com/mig-3g.20gb.slices.gi"] == "3"
    assert two["nvidia.com/mig-3g.20gb.memory"] == "20224" and two["nvidia.com/mig.config.state"] == "success"
    current = {**two, "nvidia.com/mig.config": "halves", "team": "a"}
    ones = mig_labels(cards, ledger_with(*((("1g.5gb", 19, s, 1)) for s in range(7))), refused=True)
    patch = labels_patch(current, ones, "gpumgr.io/", {GAIA_MODEL_LABEL} | owned(current, ones))
    assert patch is not None
    assert patch["nvidia.com/mig-3g.20gb.count"] is None and patch["nvidia.com/mig-1g.5gb.count"] == "7"
    assert patch["nvidia.com/mig.config.state"] == "failed"
    assert "nvidia.com/mig.config" not in patch and "team" not in patch
    assert mig_labels([], Ledger([40960])) == {"nvidia.com/mig.capable": "false", "nvidia.com/mig.strategy": "mixed"}
