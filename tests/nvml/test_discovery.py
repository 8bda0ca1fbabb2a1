"""Discovery through the real nvidia-ml-py over the fake libnvidia-ml.so.1: identity, the link matrix of every
`nvidia-smi topo -m` fixture (on drivers with and without the NVLink remote-type call), and NUMA as the kubelet
sees it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.devices.types import GPU, Inventory
from tests.fakes.nvml_fixtures import MakeBackend
from tests.fakes.nvml_node import VARIANTS
from tests.helpers import TOPO_FILES, topo_path


def small_node(count: int = 4, level: str = "SYS", numa: tuple[int | None, ...] = (0, 0, 1, 1)) -> Inventory:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:08d}-fake", minor=[0, 1, 3, 2][i % 4] + 4 * (i // 4),
                     name="NVIDIA A100-SXM4-40GB", memory_mib=40960, numa_node=numa[i % len(numa)])
                 for i in range(count))
    levels = tuple(tuple("X" if i == j else level for j in range(count)) for i in range(count))
    return Inventory(gpus=gpus, levels=levels)


def test_identity_memory_and_driver_come_through_the_real_binding(make_backend: MakeBackend):
    backend, _ = make_backend(small_node())
    inv = backend.inventory()
    assert [g.uuid for g in inv.gpus] == [f"GPU-{i:08d}-fake" for i in range(4)]
    assert [g.minor for g in inv.gpus] == [0, 1, 3, 2]
    assert {g.name for g in inv.gpus} == {"NVIDIA A100-SXM4-40GB"} and inv.gpus[0].memory_mib == 40960
    assert inv.gpus[1].bus_id == "00000000:0F:00.0"
    assert inv.driver_version == "550.54.15" and inv.cuda_driver_version == "12.4"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("topo", TOPO_FILES, ids=lambda p: p.stem)
def test_link_matrix_equals_the_fixture(make_backend: MakeBackend, topo: Path, variant: str):
    expected = inventory_from_topo_file(topo)
    backend, _ = make_backend(expected, variant)
    assert backend.inventory().levels == expected.levels


@pytest.mark.parametrize("variant", ["current", "no-remote-type"])
def test_nvswitch_node_without_remote_type_is_still_nv12_everywhere(make_backend: MakeBackend, variant: str):
    dgx = inventory_from_topo_file(topo_path("dgx-a100"))
    backend, node = make_backend(dgx, variant)
    assert node.is_switched()
    levels = backend.inventory().levels
    pairs = [levels[a][b] for a in range(8) for b in range(8) if a != b]
    assert pairs == ["NV12"] * 56


def test_links_to_a_power_cpu_are_not_taken_for_a_switch(make_backend: MakeBackend):
    minsky = inventory_from_topo_file(topo_path("ibm-power8-minsky"))
    backend, _ = make_backend(minsky, "no-remote-type", npu_links=2)
    assert backend.inventory().levels == minsky.levels


def test_numa_node_is_the_pci_devices_sysfs_node(make_backend: MakeBackend, tmp_path: Path):
    inv = small_node(numa=(None,))  # NVML's memory affinity has no answer either
    backend, node = make_backend(inv, memory_affinity=False, sysfs_root=tmp_path / "sys")
    node.write_sysfs(tmp_path / "sys", {0: 1, 1: 1, 2: 0, 3: -1})
    assert [g.numa_node for g in backend.inventory().gpus] == [1, 1, 0, None]


def test_numa_node_falls_back_to_nvml_memory_affinity(make_backend: MakeBackend, tmp_path: Path):
    backend, node = make_backend(small_node(numa=(0, 0, 1, 1)), sysfs_root=tmp_path / "sys")
    node.write_sysfs(tmp_path / "sys", {0: 1})  # sysfs knows GPU 0 only; it wins over NVML
    assert [g.numa_node for g in backend.inventory().gpus] == [1, 0, 1, 1]


def test_numa_unknown_everywhere_is_none(make_backend: MakeBackend):
    backend, _ = make_backend(replace(small_node(), gpus=small_node(numa=(None,)).gpus), memory_affinity=False)
    assert [g.numa_node for g in backend.inventory().gpus] == [None] * 4
