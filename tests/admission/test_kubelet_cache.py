"""The parsed kubelet checkpoint is reused only while its stamp proves the file unchanged: a stamp taken within
the racy window of the file's mtime proves nothing (coarse timestamps), so the file is read again."""

from __future__ import annotations

import types

from gpumgr.agent.kubelet_cache import RACY_S, KubeletCheckpointCache
from gpumgr.sim.kubelet.checkpoint_writer import checkpoint_data, render_checkpoint

CORE = "tencent.com/vcuda-core"
NOW = 1_800_000_000.0


def payload(device: str) -> bytes:
    return render_checkpoint(checkpoint_data([], {CORE: [device]}, "v2"))


def forged(mtime: float):
    """A stat that never changes: the same device, inode, size, mtime and ctime whatever is written."""
    ns = int(mtime * 1e9)
    st = types.SimpleNamespace(st_dev=1, st_ino=2, st_size=len(payload("id-a")), st_mtime_ns=ns, st_ctime_ns=ns)
    return lambda path: st


def test_an_identical_stamp_over_changed_contents_is_read_again_while_it_is_racy(tmp_path):
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_bytes(payload("id-a"))
    cache = KubeletCheckpointCache(path, stat=forged(NOW - RACY_S / 2), clock=lambda: NOW)
    assert cache.read().registered_devices[CORE] == ("id-a",)
    path.write_bytes(payload("id-b"))  # same size; the forged stat shows nothing changed
    assert cache.cached() is None
    assert cache.read().registered_devices[CORE] == ("id-b",)


def test_a_stamp_taken_well_after_the_mtime_is_trusted_and_fresh_reads_past_it(tmp_path):
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_bytes(payload("id-a"))
    cache = KubeletCheckpointCache(path, stat=forged(NOW - 10 * RACY_S), clock=lambda: NOW)
    assert cache.read().registered_devices[CORE] == ("id-a",)
    assert cache.read().registered_devices[CORE] == ("id-a",) and cache.reads == 1  # one stat, no parse
    path.write_bytes(payload("id-b"))
    assert cache.read(fresh=True).registered_devices[CORE] == ("id-b",)  # what the owner lookup does after a miss


def test_a_young_file_read_again_with_the_same_bytes_is_not_parsed_again(tmp_path):
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_bytes(payload("id-a"))
    cache = KubeletCheckpointCache(path, stat=forged(NOW - RACY_S / 2), clock=lambda: NOW)
    first = cache.read()
    assert cache.read() is first and cache.reads == 1  # read (racy), same bytes: the parse is kept
    path.write_bytes(payload("id-b"))
    assert cache.read().registered_devices[CORE] == ("id-b",) and cache.reads == 2
