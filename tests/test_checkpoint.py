"""The checkpoint on disk: atomic, versioned, checksummed, falling back to the previous generation."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from gpumgr.allocator import Allocation, ClaimHolder, ContainerHolder, Ledger, LedgerError
from gpumgr.node.checkpoint import CheckpointError, CheckpointStore
from gpumgr.vdevice.layout import allocation_key
from tests.helpers import FIXTURES


def ledger_with(*allocs: Allocation) -> Ledger:
    ledger = Ledger([16384] * 4)
    for a in allocs:
        ledger.assign(a)
    return ledger


KA = allocation_key(["core-a-0", "core-a-1"])
KB = allocation_key(["core-b-0"])
KC = allocation_key(["core-c-0"])
CLAIM_UID = "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"
A = Allocation(KA, (0, 1), 200, 0, ContainerHolder("u1", "default", "a", "main"), verified=True, created=1700000000)
B = Allocation(KB, (2,), 30, 4096, ContainerHolder("u2", "default", "b", "main", 1, memory_units=16), guess_of=2,
               answered_memory_mib=4096)


def test_round_trip_and_file_mode(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A, B), node="n1")
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    loaded = CheckpointStore(tmp_path).load()
    assert loaded.snapshot is not None and not loaded.problems
    assert loaded.snapshot.ledger.to_json() == ledger_with(A, B).to_json()
    assert loaded.snapshot.node == "n1"
    assert loaded.snapshot.ledger.allocations == {KA: A, KB: B}


def test_previous_generation_is_kept_and_used_when_the_current_is_damaged(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A))
    store.save(ledger_with(A, B))
    assert store.prev.exists()
    data = store.path.read_bytes()
    store.path.write_bytes(data[: len(data) // 2])  # truncated
    res = CheckpointStore(tmp_path).load()
    assert res.fell_back and "not valid JSON" in res.problems[0]
    assert res.snapshot is not None and set(res.snapshot.ledger.allocations) == {KA}


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
    assert res.snapshot is not None and set(res.snapshot.ledger.allocations) == {KA}


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
    doc["ledger"]["allocations"].append({"key": allocation_key(["x"]), "cards": [0], "cores": 100, "memory_mib": 0})
    from gpumgr.node.checkpoint import checksum

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


# -- hostile documents: every one is a bad generation (the agent falls back to .prev), never a crash ------------------
def resign(doc: dict) -> str:
    from gpumgr.node.checkpoint import checksum

    body = {k: v for k, v in doc.items() if k != "checksum"}
    return json.dumps({**body, "checksum": checksum(body)})


def two_generations(tmp_path) -> CheckpointStore:
    store = CheckpointStore(tmp_path)
    store.save(ledger_with(A), node="n1")
    store.save(ledger_with(A, B), node="n1")
    return store


HOSTILE = {
    "deep-array": lambda doc: "[" * 200_000 + "]" * 200_000,
    # nested as deep as the pre-check lets through, so the holder's own parsing is what refuses it
    "deep-in-holder": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": [
        {**doc["ledger"]["allocations"][0], "holder": {**doc["ledger"]["allocations"][0]["holder"],
                                                       "pod": json.loads("[" * 10 + "]" * 10)}}]}}),
    "unknown-top": lambda doc: resign({**doc, "extra": 1}),
    "unknown-in-ledger": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "extra": []}}),
    "unknown-in-card": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "cards": [
        {**c, "healthy": False} for c in doc["ledger"]["cards"]]}}),
    "rides-on-itself": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": [
        {**a, "reserve": False, "rides_on": a["key"]} for a in doc["ledger"]["allocations"]]}}),
    "rides-on-nothing": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": [
        {**a, "reserve": False, "rides_on": KC} for a in doc["ledger"]["allocations"]]}}),
    "container-on-claim-key": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": [
        {**a, "key": f"dra/{CLAIM_UID}/{i}"} for i, a in enumerate(doc["ledger"]["allocations"])]}}),
    "claim-on-container-key": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": [
        {**a, "holder": {"kind": "claim", "uid": CLAIM_UID, "namespace": "d", "name": "c"}}
        for a in doc["ledger"]["allocations"]]}}),
    "generation-string": lambda doc: resign({**doc, "generation": "x"}),
    "generation-bool": lambda doc: resign({**doc, "generation": True}),
    "version-bool": lambda doc: resign({**doc, "version": True}),
    "allocations-object": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": {"a": 1}}}),
    "cards-object": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "cards": {"a": 1}}}),
    "ledger-list": lambda doc: resign({**doc, "ledger": []}),
    "allocation-string": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": ["x"]}}),
    "card-index-unicode": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "cards": [
        {"index": "٠", "memory_mib": 16384}]}}),
    "holder-not-text": lambda doc: resign({**doc, "ledger": {**doc["ledger"], "allocations": [
        {**doc["ledger"]["allocations"][0], "holder": {**doc["ledger"]["allocations"][0]["holder"],
                                                       "pod_uid": {"nested": 1}}}]}}),
    "huge-number": lambda doc: resign({**doc, "generation": 10**400}),
    "node-number": lambda doc: resign({**doc, "node": 5}),
    "not-utf8": lambda doc: "\udcff",
}
HOSTILE_WHY = {  # what the refusal says (the file's path removed), where the reason is the point of the case
    "deep-in-holder": "holder: pod must be text", "unknown-top": "unknown field 'extra'",
    "unknown-in-ledger": "ledger: unknown field 'extra'", "unknown-in-card": "unknown field 'healthy'",
    "rides-on-itself": "rides_on names another allocation", "rides-on-nothing": "which does not reserve",
    "container-on-claim-key": "key is held by claim", "claim-on-container-key": "key is held by claim",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_malformed_current_generation_falls_back_to_the_previous(tmp_path, name):
    store = two_generations(tmp_path)
    doc = json.loads(store.path.read_text())
    text = HOSTILE[name](doc)
    store.path.write_bytes(text.encode("utf-8", "surrogateescape"))
    res = CheckpointStore(tmp_path).load()
    assert res.fell_back, res.problems
    assert res.snapshot is not None and res.snapshot.path == str(store.prev)
    assert set(res.snapshot.ledger.allocations) == {KA}
    assert len(res.problems) == 1 and str(store.path) in res.problems[0]
    assert HOSTILE_WHY.get(name, "") in res.problems[0].replace(str(store.path), ""), res.problems[0]


def test_an_allocation_key_the_agent_cannot_use_is_a_bad_generation(tmp_path):
    """`ns/pod/c` is a fine ledger key, but the agent names vDevice directories after keys: it would stop on it."""
    store = two_generations(tmp_path)
    doc = json.loads(store.path.read_text())
    doc["ledger"]["allocations"][0]["key"] = "../../etc"
    store.path.write_text(resign(doc))
    res = CheckpointStore(tmp_path).load()
    assert res.fell_back and "allocation key" in res.problems[0] and "../../etc" in res.problems[0]


BAD_FIELDS = {  # (field, bad value) of a typed allocation record: each makes the generation unusable, by name
    "verified": "true", "created": "1700000000", "reserve": 0, "rides_on": 5, "ids": "a,b",
    "answered_memory_mib": -1, "guess_of": True, "holder": "u1", "cores": 2.5, "meta": {"pod_uid": "u1"},
    "holder.kind": "pod", "holder.container_index": "0", "holder.init": "false", "holder.memory_units": 1.0,
    "holder.pod": None, "holder.extra": "x",
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_a_field_of_the_wrong_type_is_a_bad_generation_naming_the_field(tmp_path, field):
    store = two_generations(tmp_path)
    doc = json.loads(store.path.read_text())
    alloc = doc["ledger"]["allocations"][0]
    outer, _, inner = field.partition(".")
    (alloc[outer] if inner else alloc)[inner or outer] = BAD_FIELDS[field]
    store.path.write_text(resign(doc))
    res = CheckpointStore(tmp_path).load()
    assert res.fell_back and res.snapshot is not None and res.snapshot.path == str(store.prev), res.problems
    why = res.problems[0].replace(str(store.path), "")  # the path holds the test's name, and so the field's
    assert str(store.path) in res.problems[0] and re.search(rf"\b{re.escape(inner or outer)}\b", why), why


# -- format version 1 (labels as a map of strings), as the previous gpumgr wrote it ------------------------------------
V1 = FIXTURES / "checkpoint-v1" / "gpumgr_checkpoint.json"


# every label gpumgr 1 wrote, and the typed field that must hold its value (in gpumgr 1's spelling)
V1_MAP = {
    "pod_uid": lambda a: a.pod_uid, "namespace": lambda a: a.namespace, "pod": lambda a: a.pod,
    "container": lambda a: a.container, "verified": lambda a: "true" if a.verified else "false",
    "container_index": lambda a: str(a.container_holder.container_index),
    "init": lambda a: "true" if a.is_init else "false",
    "memory_units": lambda a: str(a.container_holder.memory_units),
    "created": lambda a: str(a.created), "answered_memory_mib": lambda a: str(a.answered_memory_mib),
    "guess_of": lambda a: str(a.guess_of), "rides_on": lambda a: a.rides_on, "ids": lambda a: ",".join(a.ids),
    "front_end": lambda a: "dra" if a.claim else None, "claim": lambda a: f"{a.claim.namespace}/{a.claim.name}",
    "claim_uid": lambda a: a.claim.uid, "request": lambda a: a.claim.request, "device": lambda a: a.claim.device,
    "share_id": lambda a: a.claim.share_id,
}


def test_every_version_1_label_lands_in_the_typed_record(tmp_path):
    """Against the labels in the file (written by gpumgr 1, tests/e2e/legacy_scenario.py), not against what this
    reader makes of them: a label with no typed field, or a typed field that lost its value, fails here."""
    raw = json.loads(V1.read_text())["ledger"]["allocations"]
    (tmp_path / V1.name).write_bytes(V1.read_bytes())
    led = CheckpointStore(tmp_path).load(expected_node="sim-node").snapshot.ledger
    assert set(led.allocations) == {r["key"] for r in raw}
    from gpumgr.allocator.ledger import V1_META

    assert set(V1_MAP) == V1_META  # the reader accepts exactly the labels this table checks
    seen = set()
    for r in raw:
        a = led.allocations[r["key"]]
        assert (list(a.cards), a.cores, a.memory_mib, a.reserve) == \
            (r["cards"], r["cores"], r["memory_mib"], r.get("reserve", True)), r["key"]
        for label, value in r["meta"].items():
            assert label in V1_MAP, f"{r['key']}: label {label} has no typed field"
            assert V1_MAP[label](a) == value, (r["key"], label, value)
            seen.add(label)
    assert seen == set(V1_MAP)  # the fixture exercises every label
    kinds = {(type(a.holder).__name__, a.verified, a.guess_of is not None) for a in led.allocations.values()}
    assert {("NoneType", False, False), ("ClaimHolder", True, False), ("ContainerHolder", False, True)} <= kinds
    assert {a.container_holder.container_index for a in led.allocations.values() if a.container_holder} == {0, 1}
    assert len([a for a in led.allocations.values() if a.claim]) == 2
    # written back in the current format, it reads the same
    CheckpointStore(tmp_path).save(led, node="sim-node")
    doc = json.loads((tmp_path / V1.name).read_text())
    assert doc["version"] == 2 and all("meta" not in a for a in doc["ledger"]["allocations"])
    assert CheckpointStore(tmp_path).load().snapshot.ledger.allocations == led.allocations


@pytest.mark.parametrize(("field", "value"), [("created", "٣x"), ("memory_units", "1e3"), ("container_index", "-1"),
                                              ("answered_memory_mib", "")])
def test_a_version_1_number_the_agent_reads_must_be_an_ascii_number(tmp_path, field, value):
    doc = json.loads(V1.read_text())
    doc["ledger"]["allocations"][0]["meta"][field] = value
    (tmp_path / V1.name).write_text(resign(doc))
    with pytest.raises(CheckpointError, match=f"meta.{field} must be an ASCII number"):
        CheckpointStore(tmp_path).load()


@pytest.mark.parametrize("damage", ["typed-field-in-v1", "meta-not-text", "meta-too-many"])
def test_a_malformed_version_1_allocation_is_refused(tmp_path, damage):
    doc = json.loads(V1.read_text())
    a = doc["ledger"]["allocations"][0]
    if damage == "typed-field-in-v1":
        a["verified"] = True
    elif damage == "meta-not-text":
        a["meta"]["pod_uid"] = {"nested": 1}
    else:
        a["meta"] = {f"k{i}": "v" for i in range(65)}
    (tmp_path / V1.name).write_text(resign(doc))
    with pytest.raises(CheckpointError, match="verified|meta must be an object"):
        CheckpointStore(tmp_path).load()


def test_an_oversized_file_is_refused_without_parsing(tmp_path, monkeypatch):
    import gpumgr.node.checkpoint as ck

    store = two_generations(tmp_path)
    monkeypatch.setattr(ck, "MAX_BYTES", 4096)
    store.path.write_text(" " * 5000 + store.path.read_text())
    res = CheckpointStore(tmp_path).load()
    assert res.fell_back and "larger than 4096 bytes" in res.problems[0]


def test_a_checkpoint_of_another_node_is_refused(tmp_path):
    two_generations(tmp_path)
    with pytest.raises(CheckpointError, match="written for node n1.*this is node n2"):
        CheckpointStore(tmp_path).load(expected_node="n2")
    assert CheckpointStore(tmp_path).load(expected_node="n1").snapshot is not None
    assert CheckpointStore(tmp_path).load().snapshot is not None


def test_dra_claim_keys_are_agent_keys(tmp_path):
    store = CheckpointStore(tmp_path)
    ledger = ledger_with(A)
    uid = "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"
    ledger.assign(Allocation(f"dra/{uid}/0", (3,), 20, 1024, holder=ClaimHolder(uid, "default", "c")))
    store.save(ledger, node="n1")
    res = CheckpointStore(tmp_path).load()
    assert not res.problems and len(res.snapshot.ledger.allocations) == 2


# -- `gpumgr checkpoint verify|show`: the same rules as the agent, both generations, no tracebacks -------------------
def cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "checkpoint", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("name", ["deep-array", "generation-string", "allocations-object", "holder-not-text"])
def test_verify_reports_both_generations_and_which_the_agent_loads(tmp_path, name):
    store = two_generations(tmp_path)
    store.path.write_text(HOSTILE[name](json.loads(store.path.read_text())))
    p = cli("verify", str(tmp_path))
    assert "Traceback" not in p.stderr and p.returncode == 1, p.stderr
    assert f"{store.path}: BAD" in p.stdout
    assert f"{store.prev}: ok (generation 1, 1 allocations" in p.stdout
    assert f"the agent would load {store.prev} (generation 1)" in p.stdout


def test_verify_refuses_what_the_agent_would_stop_on(tmp_path):
    store = two_generations(tmp_path)
    doc = json.loads(store.path.read_text())
    doc["ledger"]["allocations"][0]["key"] = "default/p/main"
    store.path.write_text(resign(doc))
    store.prev.write_text(resign(doc))
    p = cli("verify", str(store.path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "default/p/main" in p.stdout and "the agent would load nothing" in p.stdout


def test_verify_all_good_and_another_node(tmp_path):
    store = two_generations(tmp_path)
    p = cli("verify", str(tmp_path), "--node", "n1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{store.path}: ok (generation 2, 2 allocations" in p.stdout and f"{store.prev}: ok" in p.stdout
    assert f"the agent would load {store.path} (generation 2)" in p.stdout
    p = cli("verify", str(tmp_path), "--node", "n2")
    assert p.returncode == 1 and "written for node n1" in p.stdout and "this is node n2" in p.stdout


def test_show_says_what_is_used_and_does_not_claim_health(tmp_path):
    two_generations(tmp_path)
    p = cli("show", str(tmp_path))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("GPU"))
    assert "CORES USED" in header and "MEMORY ALLOCATED" in header and "FREE" not in header
    assert "HEALTH" not in header and " ok " not in p.stdout.replace(": ok", "")
    assert "health is not stored" in p.stdout
    row2 = next(ln for ln in lines if ln.startswith("2 "))
    assert "30/100" in row2 and "4096/16384 MiB" in row2
    row0 = next(ln for ln in lines if ln.startswith("0 "))
    assert "100/100" in row0 and "16384/16384 MiB" in row0
    row3 = next(ln for ln in lines if ln.startswith("3 "))
    assert "0/100" in row3 and "0/16384 MiB" in row3


def test_show_of_a_damaged_file_is_one_line_and_shows_what_the_agent_would_load(tmp_path):
    store = two_generations(tmp_path)
    store.path.write_text("[" * 100_000)
    p = cli("show", str(tmp_path))
    assert p.returncode == 0 and "Traceback" not in p.stderr
    assert "generation 1" in p.stdout and str(store.prev) in p.stdout
    assert str(store.path) in p.stderr and len(p.stderr.strip().splitlines()) == 1
    store.prev.write_text("{")
    p = cli("show", str(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr and "no usable checkpoint" in p.stderr


def test_verify_of_the_prev_file_reports_the_pair_and_a_missing_path_is_exit_2(tmp_path):
    store = two_generations(tmp_path)
    p = cli("verify", str(store.prev))
    assert p.returncode == 0 and f"the agent would load {store.path} (generation 2)" in p.stdout
    p = cli("verify", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "no such file" in p.stderr and "Traceback" not in p.stderr


def test_after_a_fall_back_the_next_write_keeps_the_good_previous_generation(tmp_path):
    store = two_generations(tmp_path)
    store.path.write_text("[" * 1000)
    again = CheckpointStore(tmp_path)
    assert again.load().fell_back
    again.save(ledger_with(A, B), node="n1")
    gens = again.examine()
    assert [g.problem for g in gens] == [None, None], gens  # the damaged file did not become `.prev`
    assert gens[1].snapshot is not None and set(gens[1].snapshot.ledger.allocations) == {KA}


# -- one rule for the writer and both readers: the record's constructors hold the bounds ---------------------------
@pytest.mark.parametrize("make", [
    lambda: ContainerHolder("u", "d", "p", "c", memory_units=3_000_000_000),
    lambda: ContainerHolder("u", "d", "p", "c", container_index=10**6),
    lambda: ContainerHolder("u" * 4097, "d", "p", "c"),
    lambda: ClaimHolder("u", "d", "n", device="x" * 4097),
    lambda: Allocation(KA, (0,), 30, 1024, created=10**12),
    lambda: Allocation(KA, (0,), 30, 1024, guess_of=1 << 20),
    lambda: Allocation(KA, (0,), 30, 1 << 40),
    lambda: Allocation(KA, (0,), 30, 1024, ids=("x" * 257,)),
], ids=["memory_units", "container_index", "text", "claim-text", "created", "guess_of", "memory_mib", "id"])
def test_the_record_refuses_what_a_checkpoint_cannot_hold(tmp_path, make):
    with pytest.raises(LedgerError):
        make()


@pytest.mark.parametrize(("field", "value"), [
    ("guess_of", str(1 << 20)), ("pod", "p" * 4097), ("ids", "x" * 257), ("guess_of", "9" * 5000),
    ("memory_units", "3000000000"), ("container_index", "1000000"), ("answered_memory_mib", str(1 << 40)),
])
def test_version_1_refuses_what_version_2_refuses(tmp_path, field, value):
    doc = json.loads(V1.read_text())
    a = next(a for a in doc["ledger"]["allocations"] if "pod_uid" in a["meta"] and "claim" not in a["meta"])
    a["meta"][field] = value
    (tmp_path / V1.name).write_text(resign(doc))
    with pytest.raises(CheckpointError, match=field) as e:
        CheckpointStore(tmp_path).load()
    assert "digits" not in str(e.value)


def random_ledger(rng) -> Ledger:
    """A ledger of random records, every one built through the constructors at the edges of their bounds."""
    n = rng.randint(1, 6)
    ledger = Ledger([rng.choice([1024, 16384, 81920]) for _ in range(n)])
    edge = [0, 1, 4095, 4096]

    def text() -> str:
        return rng.choice(["", "x", "ü" * rng.choice(edge), "a/b", "é\n\"\\"])

    for i in range(rng.randint(0, 12)):
        card = rng.randrange(n)
        if rng.random() < 0.3:
            uid = f"c{i}-{rng.randrange(1 << 30):x}"
            holder: ContainerHolder | ClaimHolder = ClaimHolder(uid, text(), text(), text(), text(), text(), text(),
                                                                text())
            key = f"dra/{uid}/{rng.randrange(3)}"
        else:
            holder = ContainerHolder(text(), text(), text(), text(), rng.choice([0, 1, 10**6 - 1]),
                                     rng.random() < 0.5, rng.choice([None, 0, (1 << 31) - 1]))
            key = allocation_key([f"id-{i}"])
        free = ledger.card(card)
        cores = rng.randint(1, max(1, free.free_cores))
        alloc = Allocation(
            key, (card,), cores, rng.randint(0, free.free_memory_mib), holder, verified=rng.random() < 0.5,
            ids=tuple("x" * rng.choice([1, 256]) for _ in range(rng.randint(0, 3))),
            created=rng.choice([None, 0, 10**12 - 1]), answered_memory_mib=rng.choice([None, 0, (1 << 40) - 1]),
            guess_of=rng.choice([None, 2, (1 << 20) - 1]))
        if ledger.problem(alloc) is None:
            ledger.assign(alloc)
    return ledger


@pytest.mark.parametrize("seed", range(40))
def test_any_ledger_the_constructors_allow_reads_back_equal(seed):
    import random

    from gpumgr.node.checkpoint import decode, encode

    ledger = random_ledger(random.Random(seed))
    back = decode(encode(ledger, 1, "n1"), "mem", "n1").ledger
    assert back.allocations == ledger.allocations
    assert [(c.index, c.memory_mib, c.holders) for c in back.cards] == \
        [(c.index, c.memory_mib, c.holders) for c in ledger.cards]


def test_a_version_1_fraction_of_a_second_never_rounds_past_the_bound(tmp_path):
    doc = json.loads(V1.read_text())
    a = next(a for a in doc["ledger"]["allocations"] if "pod_uid" in a["meta"] and "claim" not in a["meta"])
    a["meta"]["created"] = "999999999999.999999999"
    (tmp_path / V1.name).write_text(resign(doc))
    led = CheckpointStore(tmp_path).load().snapshot.ledger
    assert led.allocations[a["key"]].created == 999_999_999_999
    CheckpointStore(tmp_path).save(led)  # and what it became is written and read back as version 2
    assert CheckpointStore(tmp_path).load().snapshot.ledger.allocations == led.allocations


def test_after_loading_version_1_the_first_write_leaves_no_version_1_file_an_older_gpumgr_would_fall_back_to(tmp_path):
    """An older gpumgr refuses version 2 and falls back to `.prev`: that must not be the version 1 file from before
    the upgrade, or what the first write released would come back on a downgrade."""
    (tmp_path / V1.name).write_bytes(V1.read_bytes())
    store = CheckpointStore(tmp_path)
    led = store.load().snapshot.ledger
    released = sorted(led.allocations)[0]
    led.release(released)
    store.save(led, node="sim-node")
    for path in (store.path, store.prev):
        doc = json.loads(path.read_text())
        assert doc["version"] == 2 and released not in {a["key"] for a in doc["ledger"]["allocations"]}, path
    assert os.stat(store.path).st_ino != os.stat(store.prev).st_ino  # two copies: damage to one leaves the other
    store.save(led, node="sim-node")  # later writes keep the previous generation as before
    assert json.loads(store.prev.read_text())["generation"] == json.loads(store.path.read_text())["generation"] - 1
