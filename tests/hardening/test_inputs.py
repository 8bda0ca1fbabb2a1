"""Hostile or odd input files for `gpumgr topo`, `place` and `run --simulate`: one clear line and exit 2, fast.

Each case is run as a user runs it (a real subprocess with the file on disk): no traceback, no runaway memory or
time, and the message names the file and what to change.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpumgr.requests import podspec
from tests.helpers import topo_path

TIMEOUT_S = 60  # a refusal takes well under a second; before the fixes some of these ran for minutes


def gpumgr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def one_line_refusal(p: subprocess.CompletedProcess[str], *words: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines[:5]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


HEADER = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
ROWS = "GPU0\t X \tNV2\t0-15\t0\nGPU1\tNV2\t X \t0-15\t0\n"


# -- item 10: a GPU index of thousands of digits --------------------------------------------------------------
@pytest.mark.parametrize("where", ["row", "header"])
def test_a_gpu_name_with_thousands_of_digits_is_one_line_and_exit_2(tmp_path, where):
    f = tmp_path / "topo.txt"
    huge = "GPU" + "7" * 5000
    if where == "row":
        f.write_text(HEADER + ROWS + f"{huge}\tNV2\t X \t0-15\t0\n")
    else:
        f.write_text(f"\tGPU0\tGPU1\t{huge}\tCPU Affinity\n" + ROWS)
    line = one_line_refusal(gpumgr("topo", "--topo-file", str(f)), str(f))
    assert len(line) < 400  # the 5000 digits are not echoed back


# -- item 11: YAML alias bombs, deep nesting, oversized documents, absurd GPU counts -------------------------------
def alias_bomb() -> str:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{','.join([prev] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", ["node-spec", "workload", "simulate"])
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, command):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert len(bomb.read_bytes()) < 600
    if command == "node-spec":
        p = gpumgr("topo", "--node-spec", str(bomb))
    elif command == "workload":
        p = gpumgr("place", "--topo-file", str(topo_path("p40")), "--workload", str(bomb))
    else:
        p = gpumgr("run", "--node-name", "n1", "--kubeconfig", str(tmp_path / "none"), "--checkpoint-dir",
                   str(tmp_path / "c"), "--simulate", str(bomb))
    one_line_refusal(p, f"{bomb}:2:", "alias")


def test_deeply_nested_yaml_is_refused(tmp_path):
    f = tmp_path / "deep.yaml"
    f.write_text("[" * 5000 + "]" * 5000 + "\n")
    one_line_refusal(gpumgr("topo", "--node-spec", str(f)), str(f), "nested")


def test_an_oversized_document_is_refused_before_parsing(tmp_path):
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"steps": [{"pod": f"p{i}", "vcuda_core": 10} for i in range(120_000)]}))
    assert f.stat().st_size > 4 << 20
    one_line_refusal(gpumgr("place", "--topo-file", str(topo_path("p40")), "--workload", str(f)), str(f),
                     "GPUMGR_MAX_INPUT_BYTES")


def test_too_many_gpus_in_a_spec_is_refused(tmp_path):
    f = tmp_path / "many.json"
    f.write_text(json.dumps({"defaults": {"memory_mib": 1024}, "gpus": [{} for _ in range(1025)]}))
    one_line_refusal(gpumgr("topo", "--node-spec", str(f)), str(f), "1024", "GPUMGR_MAX_GPUS")


def test_too_many_gpus_in_a_topo_matrix_is_refused(tmp_path):
    n = 1025
    f = tmp_path / "wide.txt"
    f.write_text("\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\n" + "GPU0\t X\n")
    one_line_refusal(gpumgr("topo", "--topo-file", str(f)), f"{f}:1:", "1024")


def test_the_gpu_cap_can_be_raised_for_one_run(tmp_path):
    f = tmp_path / "three.json"
    f.write_text(json.dumps({"gpus": [{}, {}, {}]}))
    p = subprocess.run([sys.executable, "-m", "gpumgr.cli", "topo", "--node-spec", str(f), "--format", "json"],
                       capture_output=True, text=True, timeout=TIMEOUT_S, env={"GPUMGR_MAX_GPUS": "2", "PATH": ""})
    one_line_refusal(p, "at most 2")


# -- item 12: only ASCII digits are quantities ---------------------------------------------------------------------
@pytest.mark.parametrize("raw", ["٣٠", "３０", "3٠", "1e٣", "٣k", "𝟑𝟎"])
def test_unicode_digits_are_not_quantities(raw):
    with pytest.raises(ValueError, match="not a quantity"):
        podspec.quantity(raw)


def test_unicode_digits_in_a_pod_ask_or_predicate_annotation_are_refused():
    pod = {"metadata": {"annotations": {podspec.ANN_PREDICATE_IDX + "0": "٣"}},
           "spec": {"containers": [{"name": "g", "resources": {"limits": {podspec.RESOURCE_CORE: "٣٠"}}}]}}
    with pytest.raises(ValueError):
        podspec.gpu_containers(pod)
    assert podspec.predicate_minors(pod, 0) is None
    pod["metadata"]["annotations"][podspec.ANN_PREDICATE_IDX + "0"] = "3,1"
    assert podspec.predicate_minors(pod, 0) == [3, 1]


def test_unicode_digits_in_a_spec_numa_node_are_refused(tmp_path):
    f = tmp_path / "numa.yaml"
    f.write_text('gpus:\n  - {numa_node: "٣"}\n')
    one_line_refusal(gpumgr("topo", "--node-spec", str(f)), f"{f}:2:", "numa_node")


# -- topo files as people paste them --------------------------------------------------------------------------------
def test_a_bom_prefixed_topo_file_parses(tmp_path):
    f = tmp_path / "bom.txt"
    f.write_bytes(("\ufeff" + HEADER + ROWS).encode("utf-8"))
    p = gpumgr("topo", "--topo-file", str(f), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["levels"] == [["X", "NV2"], ["NV2", "X"]]


def test_a_header_with_gpu_names_run_together_parses(tmp_path):
    src = topo_path("dgx-a100").read_text()
    header = next(ln for ln in src.splitlines() if ln.split() and ln.split()[0] == "GPU0")
    squashed = header.replace("\tGPU", "GPU").replace(" GPU", "GPU")
    assert "GPU0GPU1GPU2" in squashed
    f = tmp_path / "squashed.txt"
    f.write_text(src.replace(header, squashed))
    good = gpumgr("topo", "--topo-file", str(topo_path("dgx-a100")), "--format", "json")
    p = gpumgr("topo", "--topo-file", str(f), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["levels"] == json.loads(good.stdout)["levels"]


def test_a_file_without_a_header_names_the_first_line_and_the_problem(tmp_path):
    f = tmp_path / "nohead.txt"
    f.write_text("GPU-0 GPU-1\nGPU0 X PIX\nGPU1 PIX X\n")
    line = one_line_refusal(gpumgr("topo", "--topo-file", str(f)), str(f), "header")
    assert "line 1" in line and "GPU-0 GPU-1" in line


# -- --topo-file: the model and memory are assumed, and can be given ---------------------------------------------
def test_topo_file_cards_are_labelled_as_assumed_or_as_given(tmp_path):
    p = gpumgr("topo", "--topo-file", str(topo_path("p40")), "--format", "json")
    assert p.returncode == 0, p.stderr
    names = {g["name"] for g in json.loads(p.stdout)["gpus"]}
    assert len(names) == 1 and "assumed" in names.pop()
    p = gpumgr("topo", "--topo-file", str(topo_path("p40")), "--format", "json", "--gpu-model", "NVIDIA H200",
               "--gpu-memory-mib", "143771")
    assert p.returncode == 0, p.stderr
    gpus = json.loads(p.stdout)["gpus"]
    assert {(g["name"], g["memory_mib"]) for g in gpus} == {("NVIDIA H200", 143771)}
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"steps": [{"pod": "a", "vcuda_core": 100}]}))
    p = gpumgr("place", "--topo-file", str(topo_path("p40")), "--gpu-model", "", "--workload", str(wl))
    one_line_refusal(p, "--gpu-model")


def test_gpu_memory_flag_takes_ascii_digits_only():
    p = gpumgr("topo", "--topo-file", str(topo_path("p40")), "--gpu-memory-mib", "١٦٣٨٤")
    assert p.returncode == 2 and "not a whole number" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize(("text", "line"), [
    ("gpus:\n  - {memory_mib: " + "1" * 5000 + "}\n", 2),
    ("name: x\ndriver_version: 2024-13-45\ngpus: [{}]\n", 2),
])
def test_a_yaml_value_python_cannot_build_is_one_line_naming_its_line(tmp_path, text, line):
    f = tmp_path / "odd.yaml"
    f.write_text(text)
    out = one_line_refusal(gpumgr("topo", "--node-spec", str(f)), f"{f}:{line}:")
    assert len(out) < 400


def test_unicode_digits_in_a_levels_matrix_are_refused(tmp_path):
    f = tmp_path / "lv.yaml"
    f.write_text('topology:\n  levels: [["X", "NV٣"], ["NV٣", "X"]]\n')
    one_line_refusal(gpumgr("topo", "--node-spec", str(f)), str(f), "NV٣")


# -- issue 18, finding 5: a GPU label with a non-ASCII digit was read as another kind of device ----------------------
@pytest.mark.parametrize("where", ["row", "header"])
@pytest.mark.parametrize("label", ["GPU\u0661", "GPU\uff11", "GPUx"])
def test_a_malformed_gpu_label_is_refused_with_the_file_and_line(tmp_path, where, label):
    f = tmp_path / "topo.txt"
    if where == "row":
        f.write_text(HEADER + f"GPU0\t X \tNV2\t0-15\t0\n{label}\tNV2\t X \t0-15\t0\n", encoding="utf-8")
        line_no = 3
    else:
        f.write_text(f"\tGPU0\t{label}\tCPU Affinity\tNUMA Affinity\n" + f"GPU0\t X \tNV2\t0-15\t0\n"
                     f"{label}\tNV2\t X \t0-15\t0\n", encoding="utf-8")
        line_no = 1
    one_line_refusal(gpumgr("topo", "--topo-file", str(f)), f"{f}:{line_no}:", "is not a GPU label")
