"""The real NVML backend, against a stand-in pynvml module."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpumgr.devices.nvml import NvmlBackend
from gpumgr.devices.types import DiscoveryError
from tests.fakes.fake_pynvml import (
    FakeGPU,
    FakeNode,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
)


def four_gpu_node() -> FakeNode:
    buses = [f"00000000:{b:02X}:00.0" for b in (0x07, 0x0F, 0x47, 0x4E)]
    gpus = [FakeGPU(uuid=f"GPU-{i}", minor=[0, 1, 3, 2][i], name="NVIDIA A30", memory_mib=24576, bus=buses[i],
                    numa=i // 2) for i in range(4)]
    # GPU0<->GPU1 bonded by 4 links (seen from both ends); GPU2<->GPU3 by 2
    for link in range(4):
        gpus[0].links[link] = buses[1]
        gpus[1].links[link] = buses[0]
    for link in range(2):
        gpus[2].links[link] = buses[3].replace("00000000:", "0000:")  # 4-digit domain form
        gpus[3].links[link] = buses[2]
    ancestors = {(0, 1): 20, (2, 3): 10, (0, 2): 50, (0, 3): 50, (1, 2): 50, (1, 3): 50}
    return FakeNode(gpus, ancestors)


def test_inventory_levels_nvlink_counts_and_identity():
    inv = NvmlBackend(four_gpu_node().module()).inventory()
    assert [g.uuid for g in inv.gpus] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert [g.minor for g in inv.gpus] == [0, 1, 3, 2]
    assert inv.gpus[0].memory_mib == 24576 and inv.gpus[2].numa_node == 1 and inv.gpus[0].name == "NVIDIA A30"
    assert inv.levels[0][1] == "NV4" and inv.levels[2][3] == "NV2"
    assert inv.levels[0][2] == "SYS" and inv.levels[1][3] == "SYS"
    assert inv.driver_version == "550.54.15" and inv.cuda_driver_version == "12.4"


def test_pcie_levels_from_common_ancestor():
    node = four_gpu_node()
    for g in node.gpus:
        g.links.clear()
    node.ancestors.update({(0, 1): 20, (2, 3): 0, (0, 2): 40})
    levels = NvmlBackend(node.module()).inventory().levels
    assert (levels[0][1], levels[2][3], levels[0][2], levels[1][2]) == ("PXB", "PIX", "NODE", "SYS")


def test_nvswitch_systems_count_switch_links():
    node = four_gpu_node()
    for g in node.gpus:
        g.links.clear()
        g.switch_links = {0, 1, 2}
    levels = NvmlBackend(node.module()).inventory().levels
    assert all(levels[a][b] == "NV3" for a in range(4) for b in range(4) if a != b)


def test_status_takes_the_newest_sample_per_process():
    st = NvmlBackend(four_gpu_node().module()).status(1)
    assert st.temperature_c == 45 and st.utilization == 10
    (p,) = st.processes
    assert p.pid == 101 and p.sm_util == 40 and p.used_memory_bytes == 256 << 20


def test_xid_events_are_reported_with_their_card():
    node = four_gpu_node()
    backend = NvmlBackend(node.module())
    backend.inventory()
    node.events.append(SimpleNamespace(device=2, eventType=8, eventData=79))
    (ev,) = backend.wait_events(0.01)
    assert (ev.index, ev.kind, ev.code) == (2, "xid", 79)
    assert backend.wait_events(0.01) == []


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (NVMLError_LibraryNotFound, r"libnvidia-ml\.so\.1\) was not found"),
        (NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
        (NVMLError_NoPermission, "no permission to use NVML"),
    ],
)
def test_nvml_failures_become_one_clear_error(error, words):
    node = four_gpu_node()
    node.init_error = error
    with pytest.raises(DiscoveryError, match=words):
        NvmlBackend(node.module())
