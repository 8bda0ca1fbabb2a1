"""Status and events through the real nvidia-ml-py over the fake libnvidia-ml.so.1, on today's driver and on
drivers that lack the newer entry points: every event lands on its own card, every missing call degrades to the
older one (or to a logged loss of one feature), never to an exception."""

from __future__ import annotations

import logging

import pytest

from gpumgr.devices.nvml import NvmlBackend
from gpumgr.devices.types import HealthEvent
from tests.fakes.nvml_fixtures import MakeBackend
from tests.nvml.test_discovery import small_node

ALL_VARIANTS = ["current", "no-procs-v3", "no-wait-v2", "no-remote-type", "old"]


def events(backend: NvmlBackend, want: int = 1, tries: int = 20) -> list[HealthEvent]:
    """Collect at least `want` events (each wait is bounded)."""
    out: list[HealthEvent] = []
    for _ in range(tries):
        out += backend.wait_events(0.2)
        if len(out) >= want:
            break
    return out


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_xid_lands_on_its_card_only(make_backend: MakeBackend, variant: str):
    backend, node = make_backend(small_node(8), variant)
    backend.inventory()
    assert backend.wait_events(0.05) == []  # registers for events
    node.xid(3, 79)
    node.xid(6, 48)
    got = events(backend, 2)
    assert [(e.index, e.kind, e.code) for e in got] == [(3, "xid", 79), (6, "xid", 48)]


@pytest.mark.parametrize("variant", ["current", "old"])
def test_double_bit_ecc_event_lands_on_its_card_and_is_counted(make_backend: MakeBackend, variant: str):
    backend, node = make_backend(small_node(8), variant)
    backend.wait_events(0.05)
    node.double_bit_ecc(5)
    (ev,) = events(backend)
    assert (ev.index, ev.kind) == (5, "ecc")
    assert backend.status(5).ecc_uncorrected == 1 and backend.status(4).ecc_uncorrected == 0


def test_ecc_counter_without_any_event_is_read(make_backend: MakeBackend):
    backend, node = make_backend(small_node())
    node.ecc_count(2, 7)
    assert [backend.status(i).ecc_uncorrected for i in range(4)] == [0, 0, 7, 0]


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_status_reads_temperature_and_processes_on_every_driver(make_backend: MakeBackend, variant: str):
    backend, node = make_backend(small_node(), variant)
    node.temperature(1, 97)
    node.process(1, 4242, 300 << 20, 35)
    st = backend.status(1)
    assert st.temperature_c == 97 and not st.lost
    (p,) = st.processes
    assert (p.pid, p.used_memory_bytes, p.sm_util) == (4242, 300 << 20, 35)
    assert st.used_memory_bytes == 300 << 20 and st.utilization == 35


@pytest.mark.parametrize("variant", ["current", "old"])
def test_a_card_off_the_bus_reads_lost_and_comes_back(make_backend: MakeBackend, variant: str):
    backend, node = make_backend(small_node(), variant)
    backend.wait_events(0.05)
    node.fall_off_bus(2)
    (ev,) = events(backend)
    assert (ev.index, ev.kind) == (-1, "lost")  # NVML does not say which: the monitor reads every card
    assert [backend.status(i).lost for i in range(4)] == [False, False, True, False]
    node.back_on_bus(2)
    assert not backend.status(2).lost and backend.status(2).temperature_c == 40


def test_each_missing_entry_point_is_logged_once(make_backend: MakeBackend, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="gpumgr.devices.nvml")
    backend, node = make_backend(small_node(), "old")
    backend.inventory()
    node.process(0, 7, 1 << 20, 5)
    for _ in range(3):
        backend.status(0)
        backend.wait_events(0.01)
    text = caplog.text
    assert text.count("no nvmlDeviceGetComputeRunningProcesses_v3") == 1
    assert text.count("no nvmlDeviceGetComputeRunningProcesses_v2") == 1
    assert text.count("no nvmlEventSetWait_v2") == 1
    assert "NvLinkRemoteDeviceType" not in text  # a PCIe-only node never asks


@pytest.mark.parametrize("driver", ["535.54.03", "535.104.05", "550.54.15"])
def test_process_list_is_right_on_drivers_whose_v3_struct_changed(make_backend: MakeBackend, driver: str):
    # 535.43 to 535.86 filled ..._v3 with a larger struct than nvidia-ml-py reads, under the same name
    backend, node = make_backend(small_node(), driver=driver)
    for pid in (100, 200, 300):
        node.process(0, pid, pid << 20, 10)
    assert sorted((p.pid, p.used_memory_bytes) for p in backend.status(0).processes) == [
        (100, 100 << 20), (200, 200 << 20), (300, 300 << 20)]


def test_an_event_between_discovery_and_the_first_wait_is_not_lost(make_backend: MakeBackend):
    backend, node = make_backend(small_node())
    backend.inventory()
    node.xid(1, 79)
    backend.status(0)  # NVML takes the XID in now, before anyone waits for events
    assert [(e.index, e.kind, e.code) for e in events(backend)] == [(1, "xid", 79)]


@pytest.mark.parametrize("variant", ["current", "old", "no-event-types"])
def test_xid_on_a_card_without_ecc_arrives(make_backend: MakeBackend, variant: str):
    # NVML refuses a registration naming an event type the card lacks (ECC off: no double-bit ECC events)
    backend, node = make_backend(small_node(), variant, no_ecc=(1,))
    backend.wait_events(0.05)
    node.xid(1, 31)
    node.double_bit_ecc(2)
    got = events(backend, 2)
    assert [(e.index, e.kind) for e in got] == [(1, "xid"), (2, "ecc")]
    assert backend.status(1).ecc_uncorrected is None and backend.status(2).ecc_uncorrected == 1


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_process_memory_not_available_reads_as_unknown(make_backend: MakeBackend, variant: str):
    # NVML_VALUE_NOT_AVAILABLE (all ones) in usedGpuMemory: old drivers, and some processes on any driver
    backend, node = make_backend(small_node(), variant)
    node.process(0, 4242, 2**64 - 1, 20)
    node.process(0, 4343, 5 << 20, 10)
    st = backend.status(0)
    assert sorted((p.pid, p.used_memory_bytes) for p in st.processes) == [(4242, 0), (4343, 5 << 20)]
    assert st.used_memory_bytes == 5 << 20
