"""The CLI as a user runs it: a real subprocess, JSON out, clear errors with file and line."""

from __future__ import annotations

import json
import subprocess
import sys

from gpumgr.allocator import Allocation, ContainerHolder, Ledger
from gpumgr.node.checkpoint import CheckpointStore
from tests.helpers import topo_path


def gpumgr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", *args], capture_output=True, text=True, timeout=60)


def test_topo_json_contract():
    p = gpumgr("topo", "--topo-file", str(topo_path("p40")), "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [g["index"] for g in doc["gpus"]] == list(range(7))
    assert set(doc["gpus"][0]) == {"index", "uuid", "minor", "name", "memory_mib", "numa_node"}
    assert doc["levels"][0][:3] == ["X", "PIX", "PIX"]
    assert doc["tree"]["level"] == "ROOT"
    assert doc["tree"]["children"][0]["level"] == "PHB"


def test_topo_tree_text_writes_sys_for_soc():
    p = gpumgr("topo", "--topo-file", str(topo_path("k40m")))
    assert p.returncode == 0
    assert p.stdout.startswith("ROOT") and "`-- SYS" in p.stdout and "SOC" not in p.stdout


def test_place_replays_the_documented_example(tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"steps": [
        {"pod": "a", "vcuda_core": 200, "vcuda_memory": 0},
        {"pod": "b", "vcuda_core": 30, "vcuda_memory": 16},
        {"release": "a"},
        {"unhealthy": 3},
        {"pod": "c", "vcuda_core": 150, "vcuda_memory": 0},
        {"release": "nobody"},
        {"healthy": 3},
    ]}))
    p = gpumgr("place", "--topo-file", str(topo_path("p40")), "--workload", str(wl))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    steps = doc["steps"]
    assert steps[0]["evaluator"] == "link" and len(steps[0]["gpus"]) == 2
    assert steps[1] == {"pod": "b", "gpus": steps[1]["gpus"], "evaluator": "share"}
    assert steps[2] == {"release": "a"} and steps[3] == {"unhealthy": 3}
    assert "multiple of 100" in steps[4]["error"]
    assert steps[5] == {"release": "nobody"}
    b_card = steps[1]["gpus"][0]
    card = doc["cards"][b_card]
    assert card == {"index": b_card, "free_cores": 70, "free_memory_mib": 16384 - 16 * 256, "mode": "shared",
                    "healthy": True}
    assert all(c["mode"] == "free" for c in doc["cards"] if c["index"] != b_card)


def test_place_memory_unit_flag(tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text('{"steps":[{"pod":"a","vcuda_core":10,"vcuda_memory":2}]}')
    p = gpumgr("place", "--topo-file", str(topo_path("gtx")), "--workload", str(wl), "--memory-unit-mib", "1024")
    doc = json.loads(p.stdout)
    assert doc["cards"][doc["steps"][0]["gpus"][0]]["free_memory_mib"] == 16384 - 2048


def test_place_bad_workload_names_file_and_line(tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text('{"steps": [\n  {"pod": "a", "vcuda_core": 100},\n  {"pod": "b", "vcuda_core": "lots"}\n]}\n')
    p = gpumgr("place", "--topo-file", str(topo_path("gtx")), "--workload", str(wl))
    assert p.returncode == 2
    assert f"{wl}:3:" in p.stderr and "vcuda_core" in p.stderr and "whole number" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_bad_topo_file_names_the_line(tmp_path):
    bad = tmp_path / "t.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\t Y \n")
    p = gpumgr("topo", "--topo-file", str(bad))
    assert p.returncode == 2 and f"{bad}:3:" in p.stderr and "Traceback" not in p.stderr
    p = gpumgr("topo", "--topo-file", str(tmp_path / "missing.txt"))
    assert p.returncode == 2 and "cannot read" in p.stderr


def test_checkpoint_show_and_verify(tmp_path):
    ledger = Ledger([16384] * 2)
    ledger.assign(Allocation("a" + "0123456789abcdef01234567", (1,), 30, 1024,  # a key the agent makes
                             ContainerHolder("u1", "default", "p", "main"), verified=True))
    store = CheckpointStore(tmp_path)
    store.save(ledger, node="n1")
    p = gpumgr("checkpoint", "verify", str(store.path))
    assert p.returncode == 0 and "ok (generation 1, 1 allocations" in p.stdout
    p = gpumgr("checkpoint", "show", str(tmp_path))
    assert p.returncode == 0 and "default/p/main" in p.stdout and "shared" in p.stdout
    store.path.write_text(store.path.read_text().replace('"cores":30', '"cores":40'))
    p = gpumgr("checkpoint", "verify", str(store.path))
    assert p.returncode == 1 and "checksum mismatch" in p.stderr


def test_topo_text_shows_the_link_levels_under_the_tree():
    p = gpumgr("topo", "--topo-file", str(topo_path("p40")))
    assert p.returncode == 0, p.stderr
    tree, _, rest = p.stdout.partition("\n\n")
    assert tree.startswith("ROOT")
    lines = rest.splitlines()
    assert lines[0].startswith("Link levels")
    matrix = [ln.split() for ln in lines if ln.lstrip().startswith("GPU")]
    assert matrix[0][:7] == [f"GPU{i}" for i in range(7)]
    assert matrix[1][:8] == ["GPU0", "X", "PIX", "PIX", "PHB", "PHB", "PHB", "PHB"]
    assert matrix[7][0] == "GPU6" and matrix[7][7] == "X"


def test_topo_text_shows_numa_nodes_when_known():
    p = gpumgr("topo", "--topo-file", str(topo_path("princeton-della-pli")))
    assert p.returncode == 0, p.stderr
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines() if ln.strip().startswith(("GPU", "NUMA"))}
    header = next(ln.split() for ln in p.stdout.splitlines() if ln.split()[:1] == ["GPU0"] and "X" not in ln)
    assert header[-1] == "NUMA"
    assert rows["GPU3"][-1] == "0" and rows["GPU4"][-1] == "1"


def test_place_output_is_one_line_per_step_and_card(tmp_path):
    wl = tmp_path / "w.json"
    steps = [{"pod": "a", "vcuda_core": 200}, {"pod": "b", "vcuda_core": 30, "vcuda_memory": 4}, {"release": "a"}]
    wl.write_text(json.dumps({"steps": steps}))
    p = gpumgr("place", "--topo-file", str(topo_path("p40")), "--workload", str(wl))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    lines = p.stdout.rstrip("\n").splitlines()
    assert len(lines) == len(steps) + 7  # as docs/configuration.md shows it
    assert lines[0].startswith('{"steps": [{"pod": "a", "gpus": [')
    assert lines[3].startswith(' "cards": [{"index": 0, ')
    for i, step in enumerate(doc["steps"]):
        assert json.dumps(step) in lines[i]
    for i, card in enumerate(doc["cards"]):
        assert json.dumps(card) in lines[3 + i]


def test_place_keeps_a_pair_on_one_numa_node(tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"steps": [{"pod": p, "vcuda_core": 100} for p in "abc"]
                             + [{"pod": "pair", "vcuda_core": 200}]}))
    p = gpumgr("place", "--topo-file", str(topo_path("princeton-della-pli")), "--workload", str(wl))
    assert p.returncode == 0, p.stderr
    assert [s["gpus"] for s in json.loads(p.stdout)["steps"]] == [[0], [1], [2], [4, 5]]


def test_a_share_when_every_card_is_held_whole_says_so(tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"steps": [{"pod": "a", "vcuda_core": 200}, {"pod": "b", "vcuda_core": 30,
                                                                           "vcuda_memory": 4}]}))
    p = gpumgr("place", "--topo-file", str(topo_path("gtx")), "--workload", str(wl))
    assert p.returncode == 0, p.stderr
    err = json.loads(p.stdout)["steps"][1]["error"]
    assert "shareable" not in err
    assert "all 2 healthy cards are held whole" in err
