"""The checkpoint on disk: atomic, versioned, checksummed, falling back to the previous generation."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gpumgr.allocator import Allocation, Ledger
from gpumgr.checkpoint import CheckpointError, CheckpointStore


def ledger_with(*allocs: Allocation) -> Ledger:
    ledger = Ledger([16384] * 4)
    for a in allocs:
        ledger.assign(a)
    return ledger


A = Allocation("ns/a/main", (0, 1), 200, 0, {"pod_uid": "u1"})
B = Allocation("ns/b/main", (2,), 30, 4096, {"pod_uid": "u2"})


def test_round_trip_and_file_mode(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A, B), node="n1")
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    loaded = CheckpointStore(tmp_path).load()
    assert loaded.snapshot is not None and not loaded.problems
    assert loaded.snapshot.ledger.to_json() == ledger_with(A, B).to_json()
    assert loaded.snapshot.node == "n1"
    assert loaded.snapshot.ledger.allocations["ns/a/main"].meta == {"pod_uid": "u1"}


def test_previous_generation_is_kept_and_used_when_the_current_is_damaged(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A))
    store.save(ledger_with(A, B))
    assert store.prev.exists()
    data = store.path.read_bytes()
    store.path.write_bytes(data[: len(data) // 2])  # truncated
    res = CheckpointStore(tmp_path).load()
    assert res.fell_back and "not valid JSON" in res.problems[0]
    assert res.snapshot is not None and set(res.snapshot.ledger.allocations) == {"ns/a/main"}


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda d: {**d, "ledger": {**d["ledger"], "allocations": []}}, "checksum mismatch"),
        (lambda d: {**d, "version": 99}, "newer gpumgr"),
        (lambda d: {"hello": 1}, "not a gpumgr checkpoint"),
    ],
)
def test_corrupted_or_future_files_fall_back(tmp_path, damage, words):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A))
    store.save(ledger_with(A, B))
    doc = json.loads(store.path.read_text())
    store.path.write_text(json.dumps(damage(doc)))
    res = CheckpointStore(tmp_path).load()
    assert words in res.problems[0] and str(store.path) in res.problems[0]
    assert res.snapshot is not None and set(res.snapshot.ledger.allocations) == {"ns/a/main"}


def test_both_generations_bad_is_an_error_not_an_empty_ledger(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A))
    store.save(ledger_with(A, B))
    store.path.write_text("{")
    store.prev.write_text("garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        CheckpointStore(tmp_path).load()


def test_no_files_is_a_first_start(tmp_path):
    res = CheckpointStore(tmp_path / "new").load()
    assert res.snapshot is None and not res.problems


def test_an_over_committed_ledger_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A))
    doc = json.loads(store.path.read_text())
    doc["ledger"]["allocations"].append({"key": "x", "cards": [0], "cores": 100, "memory_mib": 0})
    from gpumgr.checkpoint import checksum

    doc.pop("checksum")
    doc["checksum"] = checksum(doc)
    store.path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="inconsistent ledger"):
        CheckpointStore(tmp_path).load()


def test_generations_continue_after_a_restart(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A))
    store.save(ledger_with(A))
    again = CheckpointStore(tmp_path)
    again.load()
    assert again.save(ledger_with(A, B)) == 3
