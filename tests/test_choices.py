"""Per-pod choices (policy, GPU UUID select / exclude) and the node's per-card cordon: the annotations read and
checked, the cards they leave for a new allocation, the evaluators honouring them, and `gpumgr place` with them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumgr.allocator import Allocation, Ledger, NoFit, Request, choose
from gpumgr.devices.topo_text import parse_topo_text
from gpumgr.devices.types import GPU, Inventory
from gpumgr.requests.choices import (
    ANN_CORDON,
    ANN_POLICY,
    ANN_UUID_EXCLUDE,
    ANN_UUID_SELECT,
    HAMI_NOUSE_UUID,
    HAMI_POLICY,
    HAMI_USE_UUID,
    MAX_ENTRIES,
    MAX_VALUE_CHARS,
    ChoiceError,
    Choices,
    CordonWatch,
    allowed_cards,
    node_cordon,
    pod_choices,
    pod_choices_of,
)
from gpumgr.topology.cost import Topology
from tests.helpers import TOPO_FILES, topo_path

MEM = 16384


def node(memory: list[int] | None = None, prefix: str = "a30") -> Inventory:
    """The a30 fixture (NVLink pairs 0-1 and 2-3 on two sockets) as an inventory, with per-card memory."""
    levels = parse_topo_text(topo_path(prefix).read_text()).levels
    n = len(levels)
    mem = memory or [MEM] * n
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", minor=i, name="A30",
                     memory_mib=mem[i], numa_node=0 if i < n // 2 else 1) for i in range(n))
    return Inventory(gpus=gpus, levels=levels)


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


def no_cordon(inv: Inventory):
    return node_cordon({}, inv.gpus)


def ledger_of(inv: Inventory, held: list[tuple[str, tuple[int, ...], int, int]] = ()) -> Ledger:  # type: ignore[assignment]
    led = Ledger(g.memory_mib for g in inv.gpus)
    for key, cards, cores, mem in held:
        led.assign(Allocation(key, cards, cores, mem))
    return led


# -- reading the pod annotations -------------------------------------------------------------------------------
def test_no_annotations_means_no_constraint_and_the_default_policy():
    c = pod_choices({"unrelated": "x"})
    assert c == Choices() and c.policy == "binpack" and not c.constrains and not c.policy_explicit


@pytest.mark.parametrize("key", [ANN_POLICY, HAMI_POLICY])
@pytest.mark.parametrize(("text", "want"), [("binpack", "binpack"), (" Spread ", "spread"),
                                            ("topology", "topology"), ("topology-aware", "topology")])
def test_policy_from_our_key_and_hamis(key, text, want):
    c = pod_choices({key: text})
    assert c.policy == want and c.policy_explicit


def test_uuid_lists_from_our_keys_and_hamis_match_case_insensitively():
    c = pod_choices({ANN_UUID_SELECT: f"{uuid(1).upper()}, {uuid(2)}", HAMI_NOUSE_UUID: uuid(3)})
    assert c.select == {uuid(1).lower(), uuid(2).lower()} and c.exclude == {uuid(3).lower()}
    assert pod_choices({HAMI_USE_UUID: uuid(0)}).select == {uuid(0).lower()}
    pod = {"metadata": {"annotations": {ANN_UUID_EXCLUDE: uuid(0)}}}
    assert pod_choices_of(pod).exclude == {uuid(0).lower()} and pod_choices_of({"metadata": {}}) == Choices()


@pytest.mark.parametrize(("ann", "words"), [
    ({ANN_POLICY: "fastest"}, [ANN_POLICY, "'fastest'", "binpack, spread, topology"]),
    ({ANN_POLICY: "spread", HAMI_POLICY: "binpack"}, [ANN_POLICY, HAMI_POLICY, "disagree", "keep one"]),
    ({ANN_UUID_SELECT: ""}, [ANN_UUID_SELECT, "empty", "remove it"]),
    ({HAMI_USE_UUID: " "}, [HAMI_USE_UUID, "empty", "remove it"]),
    ({ANN_UUID_SELECT: f"{uuid(0)},,{uuid(1)}"}, [ANN_UUID_SELECT, "entry 2 is empty", "nvidia-smi -L"]),
    ({ANN_UUID_EXCLUDE: "GPU-1; rm -rf /"}, [ANN_UUID_EXCLUDE, "is not a GPU UUID"]),
    ({ANN_UUID_SELECT: "G" * 97}, [ANN_UUID_SELECT, "is not a GPU UUID"]),
    ({ANN_UUID_SELECT: ",".join(["GPU-x"] * (MAX_ENTRIES + 1))}, [ANN_UUID_SELECT, f"at most {MAX_ENTRIES}"]),
    ({HAMI_NOUSE_UUID: "x" * (MAX_VALUE_CHARS + 1)}, [HAMI_NOUSE_UUID, f"at most {MAX_VALUE_CHARS}"]),
])
def test_malformed_pod_annotations_are_errors_naming_the_annotation_and_the_fix(ann, words):
    with pytest.raises(ChoiceError) as e:
        pod_choices(ann)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert len(msg) < 400  # a hostile value is not echoed whole


# -- the node's cordon -----------------------------------------------------------------------------------------
def test_cordon_by_index_and_uuid():
    inv = node()
    c = node_cordon({ANN_CORDON: f"0, {uuid(3).upper()}"}, inv.gpus)
    assert c.cards == {0, 3} and not c.error
    assert node_cordon({ANN_CORDON: ""}, inv.gpus).cards == frozenset()
    assert node_cordon({}, inv.gpus).cards == frozenset()


@pytest.mark.parametrize(("text", "words"), [
    ("4", ["card 4", "the node has 4 card(s)"]),
    ("GPU-deadbeef", ["'GPU-deadbeef'", "not a card of this node"]),
    ("0,,1", ["entry 2 is empty"]),
    ("1 2", ["not a GPU UUID"]),
])
def test_a_cordon_that_is_not_understood_cordons_every_card_and_says_why(text, words):
    inv = node()
    c = node_cordon({ANN_CORDON: text}, inv.gpus)
    assert c.cards == {0, 1, 2, 3}
    assert ANN_CORDON in c.error and all(w in c.error for w in words), c.error
    a = allowed_cards(inv.gpus, Choices(), c)
    assert not a.cards and "treated as cordoned" in a.why_none() and words[0] in a.why_none()


def test_cordon_watch_follows_the_node_object():
    inv = node()
    w = CordonWatch(inv.gpus)
    assert w().cards == frozenset()
    assert w.update({"metadata": {"annotations": {ANN_CORDON: "2"}}}) is True
    assert w().cards == {2}
    assert w.update({"metadata": {"annotations": {ANN_CORDON: "2"}}}) is False
    assert w.update({"metadata": {}}) is True and w().cards == frozenset()


# -- what a new allocation may use -----------------------------------------------------------------------------
def test_select_then_exclude_then_cordon():
    inv = node()
    cordon = node_cordon({ANN_CORDON: "2"}, inv.gpus)
    ch = pod_choices({ANN_UUID_SELECT: ",".join(uuid(i) for i in (0, 1, 2)) + ",GPU-elsewhere",
                      ANN_UUID_EXCLUDE: uuid(0)})
    a = allowed_cards(inv.gpus, ch, cordon)
    assert a.cards == {1} and a.restricted
    assert a.mask(4) == (False, True, False, False)
    assert ANN_UUID_SELECT in a.describe() and ANN_UUID_EXCLUDE in a.describe() and ANN_CORDON in a.describe()
    free = allowed_cards(inv.gpus, Choices(), no_cordon(inv))
    assert free.cards == {0, 1, 2, 3} and not free.restricted and free.describe() == ""


@pytest.mark.parametrize(("ann", "cordon", "words"), [
    ({ANN_UUID_SELECT: "GPU-on-another-node"}, "", ["none of the cards named in", ANN_UUID_SELECT]),
    ({ANN_UUID_SELECT: uuid(1), ANN_UUID_EXCLUDE: uuid(2)}, "1", ["cordoned", ANN_CORDON, "cards 1"]),
    ({HAMI_USE_UUID: uuid(1), ANN_UUID_EXCLUDE: uuid(2)}, "", []),
    ({}, "0,1,2,3", ["every card is cordoned", "keep running"]),
])
def test_nothing_left_is_explained(ann, cordon, words):
    inv = node()
    a = allowed_cards(inv.gpus, pod_choices(ann), node_cordon({ANN_CORDON: cordon}, inv.gpus))
    if not words:
        assert a.cards == {1}
        return
    assert a.cards == frozenset()
    msg = a.why_none()
    assert all(w in msg for w in words), msg


def test_exclude_of_every_selected_card_is_explained():
    inv = node()
    a = allowed_cards(inv.gpus, pod_choices({ANN_UUID_SELECT: uuid(1), HAMI_NOUSE_UUID: uuid(2)}),
                      no_cordon(inv))
    assert a.cards == {1}
    a = allowed_cards(inv.gpus, pod_choices({ANN_UUID_SELECT: uuid(1), ANN_UUID_EXCLUDE: uuid(1).upper()}),
                      no_cordon(inv))  # in both: exclude wins
    assert not a.cards and ANN_UUID_EXCLUDE in a.why_none()
    a = allowed_cards(inv.gpus, pod_choices({ANN_UUID_EXCLUDE: ",".join(uuid(i) for i in range(4))}),
                      no_cordon(inv))
    assert a.why_none() == f"every card of this node is excluded by {ANN_UUID_EXCLUDE}"


# -- the evaluators honour the allowed cards and the policy ----------------------------------------------------
@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_evaluators_never_leave_the_allowed_cards(path):
    topo = Topology(parse_topo_text(path.read_text()).levels)
    n = topo.n
    allowed = frozenset(range(0, n, 2)) if n > 2 else frozenset({1})
    for policy in ("binpack", "spread", "topology"):
        led = Ledger([MEM] * n)
        for k, cores in enumerate([30, 100, 50, 20, 100]):
            req = Request(cores, 1024 if cores < 100 else 0)
            try:
                placed = choose(topo, led, req, allowed, policy)  # type: ignore[arg-type]
            except NoFit as e:
                assert "allowed" in str(e), e
                continue
            assert set(placed.cards) <= allowed, (policy, placed)
            led.assign(Allocation(f"p{k}", placed.cards, req.cores, req.memory_mib))
        if len(allowed) >= 2:
            placed = choose(topo, Ledger([MEM] * n), Request(200), allowed, policy)  # type: ignore[arg-type]
            assert set(placed.cards) <= allowed
            best = min(topo.worst((a, b)) for a in allowed for b in allowed if a < b)
            assert topo.worst(placed.cards) == best  # still the best worst link among the allowed cards


def test_all_cards_allowed_is_the_default_choice():
    inv = node(prefix="dgx1")
    topo = Topology.of(inv)
    led = ledger_of(inv, [("a", (0,), 30, 2048), ("b", (5,), 100, 0), ("c", (6,), 60, 8192)])
    every = frozenset(range(inv.count))
    for req in (Request(20, 1024), Request(40, 9000), Request(100), Request(200), Request(300)):
        assert choose(topo, led, req).cards == choose(topo, led, req, every, "binpack").cards


def test_share_policies_differ_as_documented():
    # cards 0,1 and 2,3 are NVLink pairs on two sockets; card 3 has twice the memory; card 2 is held whole
    inv = node(memory=[MEM, MEM, MEM, 2 * MEM])
    topo = Topology.of(inv)
    ask = Request(20, 4096)
    led = ledger_of(inv, [("whole", (2,), 100, 0)])
    assert choose(topo, led, ask).cards == (0,)  # binpack (default): the tightest fit, a 16 GiB card
    assert choose(topo, led, ask, None, "binpack").cards == (0,)
    assert choose(topo, led, ask, None, "topology").cards == (3,)  # the isolated card: the 0-1 pair stays whole
    assert choose(topo, led, ask, None, "spread").cards == (3,)  # the emptiest card
    # with a shared card: binpack and topology share it, spread still takes the emptiest
    led = ledger_of(inv, [("whole", (2,), 100, 0), ("share", (1,), 30, 1024)])
    assert choose(topo, led, ask).cards == (1,)
    assert choose(topo, led, ask, None, "topology").cards == (1,)
    assert choose(topo, led, ask, None, "spread").cards == (3,)
    # allowed {0, 3}: the scores still see card 1 (free or not), so topology keeps choosing as on the whole node
    led = ledger_of(inv, [("whole", (2,), 100, 0)])
    assert choose(topo, led, ask, {0, 3}, "topology").cards == (3,)
    assert choose(topo, led, ask, {0, 1}, "topology").cards == (0,)


def test_whole_card_spread_goes_far_from_the_busy_cards():
    inv = node()
    topo = Topology.of(inv)
    led = ledger_of(inv, [("busy", (0,), 100, 0)])
    assert choose(topo, led, Request(100)).cards == (1,)  # default: the card that breaks no free pair
    assert choose(topo, led, Request(100), None, "binpack").cards == (1,)
    assert choose(topo, led, Request(100), None, "spread").cards[0] in (2, 3)  # the other socket


def test_cordon_keeps_running_pods_and_steers_new_ones():
    inv = node()
    topo = Topology.of(inv)
    led = ledger_of(inv, [("old", (0,), 30, 1024)])
    cordon = node_cordon({ANN_CORDON: uuid(0)}, inv.gpus)
    a = allowed_cards(inv.gpus, Choices(), cordon)
    new = choose(topo, led, Request(30, 1024), a.cards, "binpack")
    assert new.cards != (0,)  # binpack would have taken the shared card 0
    assert led.held_by("old") is not None and led.cards[0].mode == "shared"  # choosing changes nothing


def test_refusals_say_the_allowed_cards_were_the_limit():
    inv = node()
    topo = Topology.of(inv)
    led = ledger_of(inv, [("x", (1,), 100, 0)])
    with pytest.raises(NoFit, match="none of them allowed"):
        choose(topo, led, Request(100), {1}, "binpack")
    with pytest.raises(NoFit, match="none of them allowed"):
        choose(topo, led, Request(30, 1024), {1})
    with pytest.raises(NoFit, match="of the allowed cards"):
        choose(topo, led, Request(200), {0, 1})
    with pytest.raises(NoFit, match="no card of this node may be used"):
        choose(topo, led, Request(30, 1024), frozenset())
    with pytest.raises(ValueError, match="unknown policy"):
        choose(topo, led, Request(30, 1024), None, "random")  # type: ignore[arg-type]


# -- gpumgr place with annotations and cordon ------------------------------------------------------------------
def place(tmp_path, steps: list[dict], raw: str | None = None) -> subprocess.CompletedProcess[str]:
    wl = tmp_path / "w.json"
    wl.write_text(raw if raw is not None else json.dumps({"steps": steps}, indent=1))
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "place", "--topo-file", str(topo_path("a30")),
                           "--gpu-memory-mib", str(MEM), "--gpu-model", "A30", "--workload", str(wl)],
                          capture_output=True, text=True, timeout=60)


def test_place_honours_policy_select_exclude_and_cordon(tmp_path):
    p = place(tmp_path, [
        {"pod": "a", "vcuda_core": 30, "vcuda_memory": 4},
        {"pod": "b", "vcuda_core": 30, "vcuda_memory": 4, "annotations": {ANN_POLICY: "spread"}},
        {"cordon": "0"},
        {"pod": "c", "vcuda_core": 30, "vcuda_memory": 4},
        {"pod": "d", "vcuda_core": 100, "annotations": {HAMI_NOUSE_UUID: "x"}},
        {"pod": "e", "vcuda_core": 100, "annotations": {ANN_UUID_SELECT: "GPU-elsewhere"}},
        {"cordon": "0,1,2,3"},
        {"pod": "f", "vcuda_core": 10, "vcuda_memory": 1},
        {"cordon": ""},
        {"pod": "g", "vcuda_core": 60, "vcuda_memory": 1},
    ])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    s = doc["steps"]
    a, b = s[0]["gpus"][0], s[1]["gpus"][0]
    assert a == 0 and b in (2, 3)  # default packs; spread takes an empty card on the other socket
    assert s[2] == {"cordon": [0]}
    assert s[3]["gpus"] == [b]  # binpack, card 0 cordoned: the other shared card
    assert s[4]["evaluator"] == "fragment" and s[4]["gpus"][0] not in (0, b)
    assert "none of the cards named in gpumgr.io/gpu-uuid-select" in s[5]["error"]
    assert "every card is cordoned" in s[7]["error"]
    assert s[9]["gpus"] == [0]  # cordon lifted: card 0 (a's, 70 cores free) takes 60 again
    cards = {c["index"]: c for c in doc["cards"]}
    assert cards[0]["mode"] == "shared" and "cordoned" not in cards[0]  # a kept running through the cordon


def test_place_marks_cordoned_cards(tmp_path):
    p = place(tmp_path, [{"cordon": f"{uuid(9)}"}], raw=None)
    assert p.returncode == 2 and "not a card of this node" in p.stderr  # a30 via topo file: other UUIDs
    p = place(tmp_path, [{"cordon": "1"}, {"pod": "a", "vcuda_core": 400}])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert "needs 4 free whole cards, 3 free of the allowed cards" in doc["steps"][1]["error"]
    assert [c.get("cordoned", False) for c in doc["cards"]] == [False, True, False, False]


def test_place_bad_annotation_names_file_line_and_annotation(tmp_path):
    raw = ('{"steps": [\n  {"pod": "a", "vcuda_core": 30, "vcuda_memory": 4},\n'
           '  {"pod": "b", "vcuda_core": 30, "vcuda_memory": 4,\n'
           '   "annotations": {"gpumgr.io/gpu-policy": "fastest"}}\n]}\n')
    p = place(tmp_path, [], raw=raw)
    assert p.returncode == 2 and p.stdout == ""
    assert ":4:" in p.stderr and ANN_POLICY in p.stderr and "binpack, spread, topology" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    for bad in ({"annotations": ["x"]}, {"annotations": {ANN_POLICY: 3}}):
        p = place(tmp_path, [{"pod": "a", "vcuda_core": 30, "vcuda_memory": 4, **bad}])
        assert p.returncode == 2 and "annotations" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = place(tmp_path, [{"cordon": 1}])
    assert p.returncode == 2 and "cordon" in p.stderr and "Traceback" not in p.stderr


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_allowed_choices_are_sound_and_complete(data):
    """Whatever the ledger, allowed set and policy: the cards chosen are allowed, fit, and a refusal happens only
    when no allowed card (set) has room."""
    path = data.draw(st.sampled_from(TOPO_FILES[:8]), label="topology")
    topo = Topology(parse_topo_text(path.read_text()).levels)
    n = topo.n
    led = Ledger([MEM] * n)
    for k in range(data.draw(st.integers(0, n), label="holders")):
        cores = data.draw(st.sampled_from([10, 30, 60, 100]))
        cards = (data.draw(st.integers(0, n - 1)),)
        alloc = Allocation(f"h{k}", cards, cores, 0 if cores == 100 else 2048)
        if led.problem(alloc) is None:
            led.assign(alloc)
    for i in data.draw(st.sets(st.integers(0, n - 1), max_size=2), label="unhealthy"):
        led.set_healthy(i, False)
    allowed = data.draw(st.frozensets(st.integers(0, n - 1), min_size=1), label="allowed")
    policy = data.draw(st.sampled_from(["binpack", "spread", "topology"]), label="policy")
    cores = data.draw(st.sampled_from([20, 50, 100, 200, 300]), label="cores")
    req = Request(cores, 4096 if cores < 100 else 0)
    if req.whole and req.cards_needed > n:
        return
    room = [c.index for c in led.cards if c.index in allowed and c.healthy and (
        c.mode == "free" if req.whole else
        c.mode != "exclusive" and c.free_cores >= req.cores and c.free_memory_mib >= req.memory_mib)]
    try:
        placed = choose(topo, led, req, allowed, policy)
    except NoFit:
        assert len(room) < req.cards_needed, (room, req)
        return
    assert set(placed.cards) <= set(room) and len(placed.cards) == req.cards_needed
    assert led.problem(Allocation("new", tuple(sorted(placed.cards)), req.cores, req.memory_mib)) is None
