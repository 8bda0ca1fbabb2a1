"""The fake libnvidia-ml.so.1 itself, where the NVML tests and `gpumgr demo --nvml` depend on it: large nodes get
valid PCI bus ids, and a garbage control line does not stop the commands after it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gpumgr.devices import fake_nvml_node
from tests.fakes.nvml_fixtures import MakeBackend
from tests.nvml.test_discovery import small_node
from tests.nvml.test_status_and_events import events

BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


def test_a_64_gpu_node_has_valid_distinct_bus_ids(make_backend: MakeBackend):
    backend, node = make_backend(small_node(64))
    buses = [g.bus_id for g in backend.inventory().gpus]
    assert buses == node.bus_ids
    assert all(BUS_ID.match(b) for b in buses), [b for b in buses if not BUS_ID.match(b)]
    assert len(set(buses)) == 64


def test_npu_link_buses_are_valid_and_never_a_gpu_bus(tmp_path: Path):
    node = fake_nvml_node.FakeNvmlNode(tmp_path, small_node(40, level="NV2"), npu_links=1).write()
    npu = [line.split()[4] for line in node.spec.read_text().splitlines() if line.startswith("link ")
           and line.split()[3] == "npu"]
    assert len(npu) == 40 and all(BUS_ID.match(b) for b in npu)
    assert not set(npu) & set(node.bus_ids)


def test_an_over_long_control_line_is_skipped_not_a_stall(make_backend: MakeBackend):
    backend, node = make_backend(small_node())
    backend.wait_events(0.05)
    node.send("xid 1 " + "9" * 600)
    node.xid(2, 43)
    assert [(e.index, e.kind, e.code) for e in events(backend)] == [(2, "xid", 43)]


def test_outside_a_checkout_the_library_path_comes_from_the_environment(tmp_path: Path):
    lib = tmp_path / "libnvidia-ml.so.1"
    code = "from gpumgr.devices.fake_nvml_node import library; print(library())"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path.cwd()), fake_nvml_node.LIBRARY_ENV: str(lib)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(lib)
