"""`nvidia-smi topo -m` parsing: every real fixture, and broken input named by line."""

from __future__ import annotations

import re

import pytest

from gpumgr.devices.topo_text import TopoParseError, parse_topo_text
from tests.helpers import TOPO_FILES, topo_path


def reference_block(text: str) -> list[list[str]]:
    """An independent, minimal reading of the GPU block (the shape the contract checker uses)."""
    rows = {}
    for raw in text.splitlines():
        line = raw.lstrip("#").strip()
        m = re.match(r"GPU(\d+)\s+(.*)$", line)
        if m and not line.split()[1].startswith("GPU"):
            rows[int(m.group(1))] = line.split()[1:]
    n = len(rows)
    return [["X" if c == "X" else ("SYS" if c == "SOC" else c) for c in rows[i][:n]] for i in range(n)]


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_every_fixture_parses_to_its_gpu_block(path):
    text = path.read_text()
    m = parse_topo_text(text, path.name)
    assert [list(r) for r in m.levels] == reference_block(text)
    assert len(m.numa_nodes) == m.count


def test_numa_and_affinity_columns_are_read():
    m = parse_topo_text(topo_path("dgx-a100").read_text())
    assert m.numa_nodes == (3, 3, 1, 1, 7, 7, 5, 5)
    # blank CPU affinity (tabs) does not shift the NUMA column
    m = parse_topo_text(topo_path("princeton-della-pli").read_text())
    assert m.numa_nodes == (0, 0, 0, 0, 1, 1, 1, 1)
    # a header whose last NIC name touches "CPU Affinity" with one space
    m = parse_topo_text(topo_path("nersc").read_text())
    assert m.numa_nodes == (0, 0, 1, 1, 0, 0, 0, 0)
    # lists such as "0,5-11" give their first node; N/A gives None
    assert parse_topo_text(topo_path("gh200").read_text()).numa_nodes == (0, 1, 2, 3)
    assert parse_topo_text(topo_path("gtx1080ti").read_text()).numa_nodes == (None, None)


def test_soc_is_read_as_sys_and_odd_counts_work():
    m = parse_topo_text(topo_path("k40m").read_text())
    assert m.levels[0][2] == "SYS"
    assert parse_topo_text(topo_path("p40").read_text()).count == 7


GOOD = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity
GPU0\t X \tPIX\tSYS\t0-3
GPU1\tPIX\t X \tSYS\t0-3
GPU2\tSYS\tSYS\t X \t4-7
"""


def test_good_sample_parses():
    assert parse_topo_text(GOOD).levels[0] == ("X", "PIX", "SYS")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("nothing here\n", None, "no header line"),
        (GOOD.replace("GPU1\tPIX\t X \tSYS", "GPU1\tPIX\t X \tFOO"), 3, "unknown link level 'FOO'"),
        (GOOD.replace("GPU2\tSYS\tSYS\t X ", "GPU2\tSYS\tPIX\t X "), 3, "says GPU2-GPU1 is PIX"),
        (GOOD.replace("GPU1\tPIX\t X \tSYS\t0-3", "GPU1\tPIX"), 3, "row has 1 cells, expected at least 3"),
        ("\n".join(GOOD.splitlines()[:3]) + "\n", None, "no row for GPU2"),
        (GOOD + "GPU1\tPIX\t X \tSYS\t0-3\n", 5, "GPU1 appears twice"),
        (GOOD.replace("GPU0\t X \tPIX", "GPU0\tPIX\tPIX"), 2, "against itself should be 'X'"),
        (GOOD + "GPU7\tPIX\t X \tSYS\t0-3\n", 5, "only 3 GPU columns"),
    ],
)
def test_broken_input_names_the_line(text, line, words):
    with pytest.raises(TopoParseError) as e:
        parse_topo_text(text, "node.txt")
    msg = str(e.value)
    assert words in msg
    assert msg.startswith("node.txt")
    if line is not None:
        assert msg.startswith(f"node.txt:{line}:"), msg
