"""The shim-status reader reuses each container's answer for a short window, so a scraper calling /metric in a loop
does not make the agent walk every container's /dev/shm continuously; the cache is bounded and forgets containers
that are gone. A real directory tree as the proc root, and a clock the test moves (no sleeping)."""

from __future__ import annotations

from pathlib import Path

from gpumgr.metrics.shim_status import CACHE_S, MAX_CACHED, ShimStatusReader
from tests.metrics.test_shim_mode import shm_of, status

UUID = "GPU-12345678-aaaa"
CID = "containerd://" + "ab" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_mode(proc: Path, pid: int, mode: str) -> None:
    (shm_of(proc, pid) / "vcuda-v2-1-1.status").write_text(status("ab" * 32, [(0, UUID, mode)]))


def test_a_read_within_the_window_reuses_the_answer_and_one_after_it_reads_again(tmp_path: Path):
    proc, clock = tmp_path / "proc", Clock()
    reader = ShimStatusReader(proc, clock=clock)
    write_mode(proc, 7, "device")
    assert reader.modes([7], CID) == {UUID: "device"}

    write_mode(proc, 7, "unthrottled")
    clock.now += CACHE_S - 0.5
    assert reader.modes([7], CID) == {UUID: "device"}  # no file system work: the change is not seen yet

    clock.now += 1.0
    assert reader.modes([7], CID) == {UUID: "unthrottled"}


def test_the_answer_is_per_container_and_pid(tmp_path: Path):
    proc, clock = tmp_path / "proc", Clock()
    reader = ShimStatusReader(proc, clock=clock)
    write_mode(proc, 7, "device")
    write_mode(proc, 8, "unthrottled")
    assert reader.modes([7], CID) == {UUID: "device"}
    assert reader.modes([8], CID) == {UUID: "unthrottled"}  # another PID of the container (restarted): read
    assert reader.modes([7], "containerd://" + "cd" * 32) == {}  # the file names another container


def test_a_caller_changing_the_answer_does_not_change_the_cache(tmp_path: Path):
    proc = tmp_path / "proc"
    reader = ShimStatusReader(proc, clock=Clock())
    write_mode(proc, 7, "device")
    reader.modes([7], CID).clear()
    assert reader.modes([7], CID) == {UUID: "device"}


def test_containers_that_are_gone_drop_out_and_the_cache_is_bounded(tmp_path: Path):
    proc, clock = tmp_path / "proc", Clock()
    reader = ShimStatusReader(proc, clock=clock)
    for pid in range(100, 110):
        reader.modes([pid], f"gone-{pid}")
    assert reader.cached() == 10
    clock.now += CACHE_S + 1  # those containers are not asked about again
    reader.modes([7], CID)
    assert reader.cached() == 1

    for pid in range(MAX_CACHED + 50):  # more live containers than the cache holds, all within one window
        reader.modes([pid], f"c-{pid}")
    assert reader.cached() == MAX_CACHED
