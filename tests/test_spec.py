"""Node spec files for the simulated node: every topology form, and errors naming file and line."""

from __future__ import annotations

import json

import pytest

from gpumgr.devices import SimulatedBackend, load_node_spec
from gpumgr.files.docfile import InputError
from tests.helpers import topo_path

SPEC = """\
name: sim-a
driver_version: "550.54.15"
defaults: {model: NVIDIA A30, memory_mib: 24576}
gpus:
  - {uuid: GPU-a, minor: 0}
  - {uuid: GPU-b, minor: 1}
  - {uuid: GPU-c, minor: 3, memory_mib: 12288}
topology:
  levels:
    - [X, NV4, SYS]
    - [NV4, X, SYS]
    - [SYS, SYS, X]
"""


def test_yaml_spec_with_level_matrix(tmp_path):
    f = tmp_path / "node.yaml"
    f.write_text(SPEC)
    inv = load_node_spec(f)
    assert [g.uuid for g in inv.gpus] == ["GPU-a", "GPU-b", "GPU-c"]
    assert [g.minor for g in inv.gpus] == [0, 1, 3]
    assert [g.memory_mib for g in inv.gpus] == [24576, 24576, 12288]
    assert inv.levels[0][1] == "NV4" and inv.driver_version == "550.54.15"


def test_json_spec_with_topology_file_and_generated_identity(tmp_path):
    topo = topo_path("dgx-a100")
    f = tmp_path / "node.json"
    f.write_text(json.dumps({"defaults": {"model": "A100", "memory_mib": 40960},
                             "topology": {"file": str(topo)}}))
    inv = load_node_spec(f)
    assert inv.count == 8 and inv.gpus[0].numa_node == 3
    assert len({g.uuid for g in inv.gpus}) == 8 and inv.gpus[5].minor == 5


def test_inline_nvidia_smi_text(tmp_path):
    text = topo_path("k40m").read_text()
    body = "topology:\n  nvidia_smi: |\n" + "".join("    " + line + "\n" for line in text.splitlines())
    f = tmp_path / "node.yaml"
    f.write_text(body)
    assert load_node_spec(f).levels[0][2] == "SYS"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (SPEC.replace("[NV4, X, SYS]", "[NV4, X, FAST]"), 11, "unknown link level 'FAST'"),
        (SPEC.replace("- [SYS, SYS, X]", "- [SYS, NV2, X]"), 12, "GPU2-GPU1 is NV2 but GPU1-GPU2 is SYS"),
        (SPEC.replace("{uuid: GPU-b, minor: 1}", "{uuid: GPU-b, minor: 1, memory_mib: lots}"), 6,
         "memory_mib must be a positive whole number"),
        (SPEC.replace("{uuid: GPU-c, minor: 3", "{uuid: GPU-a, minor: 3"), 4, "UUIDs must be unique"),
        (SPEC.replace("  - {uuid: GPU-c, minor: 3, memory_mib: 12288}\n", ""), 4,
         "lists 2 GPUs but the topology has 3"),
        (SPEC.replace("    - [SYS, SYS, X]\n", ""), 10, "row has 3 entries, expected 2"),
        (SPEC + "colour: blue\n", 13, "unknown key"),
        ("gpus: [\n", 2, "not valid YAML/JSON"),
        ("topology: {levels: [[X]], file: a.txt}\n", 1, "exactly one of"),
    ],
)
def test_bad_specs_name_file_and_line(tmp_path, text, line, words):
    f = tmp_path / "node.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        load_node_spec(f)
    assert str(e.value).startswith(f"{f}:{line}:"), str(e.value)
    assert words in str(e.value)


def test_simulated_backend_injects_events_and_usage(tmp_path):
    f = tmp_path / "node.yaml"
    f.write_text(SPEC)
    sim = SimulatedBackend.from_spec(f)
    assert sim.wait_events(0.01) == []
    sim.inject_xid(1, 79)
    sim.fall_off_bus(2)
    events = sim.wait_events(0.01)
    assert [(e.index, e.kind, e.code) for e in events] == [(1, "xid", 79), (2, "lost", 0)]
    assert sim.status(2).lost
    sim.set_process(0, pid=4242, used_memory_bytes=1 << 30, sm_util=35)
    st = sim.status(0)
    assert st.used_memory_bytes == 1 << 30 and st.utilization == 35 and st.processes[0].pid == 4242
