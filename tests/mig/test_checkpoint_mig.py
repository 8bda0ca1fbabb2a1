"""MIG instances in the checkpoint: format version 3 only when there are some (a ledger without MIG stays version 2,
which a gpumgr without MIG reads); a slot in flight and a share inside an instance read back; damage is refused
with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumgr.allocator import Allocation, Ledger
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.node.checkpoint import CheckpointError, CheckpointStore, checksum, decode


def ledger_with_mig() -> Ledger:
    led = Ledger([81920, 81920])
    led.add_slot(MigSlot(card=0, start=0, size=4, profile_id=9, profile="3g.40gb", memory_mib=40704, gi=1, ci=0,
                         uuid="MIG-11111111-2222-3333-4444-555555555555"))
    led.add_slot(MigSlot(card=0, start=4, size=1, profile_id=19, profile="1g.10gb", memory_mib=9984,
                         origin="claim"))  # in flight
    led.assign(Allocation(key="a" + "0" * 24, cards=(0,), cores=40, memory_mib=8192, mig="mig-0-0"))
    return led


def test_versions_and_round_trip(tmp_path: Path):
    store = CheckpointStore(tmp_path)
    store.save(Ledger([81920, 81920]))
    assert json.loads(store.path.read_text())["version"] == 2
    store.save(ledger_with_mig())
    doc = json.loads(store.path.read_text())
    assert doc["version"] == 3 and [s["start"] for s in doc["ledger"]["mig"]] == [0, 4]
    back = CheckpointStore(tmp_path).load().snapshot
    assert back is not None and back.ledger.slots == ledger_with_mig().slots
    assert back.ledger.slot_holders["mig-0-0"]["a" + "0" * 24].memory_mib == 8192
    assert back.ledger.card(0).mode == "mig" and back.ledger.card(1).mode == "free"


def _resealed(doc: dict) -> bytes:
    doc.pop("checksum", None)
    doc["checksum"] = checksum(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: d.update(version=2), "format version 2 has no MIG instances"),
    (lambda d: d["ledger"]["mig"][0].update(start=99), "start must be a whole number"),
    (lambda d: d["ledger"]["mig"][1].update(start=2), "would overlap mig-0-0"),
    (lambda d: d["ledger"]["mig"][0].update(colour="red"), "unknown field 'colour'"),
    (lambda d: d["ledger"]["allocations"][0].update(mig="mig-1-0"), "no MIG instance mig-1-0"),
])
def test_damaged_mig_records_are_refused(tmp_path: Path, damage, message: str):
    CheckpointStore(tmp_path).save(ledger_with_mig())
    doc = json.loads((tmp_path / "gpumgr_checkpoint.json").read_text())
    damage(doc)
    with pytest.raises(CheckpointError, match=message):
        decode(_resealed(doc), "ckpt")
