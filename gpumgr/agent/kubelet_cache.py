"""The kubelet's device checkpoint, parsed again only when the file changed.

A file's stat can stay the same over changed contents: on a filesystem with coarse timestamps two writes within
one tick keep the size, inode and mtime (the same "racy" case git handles for its index). So a parse is trusted
for an unchanged stamp only when it was read more than `RACY_S` after the file's mtime: a write after that read
would have moved the mtime. Any other parse is read again at the next use; when the bytes read are the ones
parsed last time, that parse is kept (during an admission burst the file is always young, and reading a few
kilobytes costs far less than parsing and checksumming them again).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpumgr.node.kubelet_checkpoint import (
    CHECKPOINT_FILE_NAME,
    KubeletCheckpoint,
    KubeletCheckpointError,
    parse_kubelet_checkpoint,
)

RACY_S = 2.0  # more than any filesystem's timestamp tick (FAT: 2 s)

Stamp = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


@dataclass(frozen=True)
class _Parsed:
    stamp: Stamp
    raw: bytes
    ckpt: KubeletCheckpoint
    trusted: bool  # read more than RACY_S after the mtime: the same stamp means the same contents


class KubeletCheckpointCache:
    def __init__(self, path: Path | str, stat: Callable[[str], os.stat_result] = os.stat,
                 clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self._stat, self._clock = stat, clock
        self._parsed: _Parsed | None = None
        self.reads = 0  # parses done (for the bench and tests)

    def stamp(self) -> Stamp | None:
        try:
            st = self._stat(str(self.path))
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def cached(self) -> KubeletCheckpoint | None:
        """The parse of the file as it is now, when one can be trusted without reading (one stat)."""
        p, stamp = self._parsed, self.stamp()
        return p.ckpt if p is not None and p.trusted and stamp is not None and p.stamp == stamp else None

    def read(self, fresh: bool = False) -> KubeletCheckpoint:
        """The parsed file (blocking I/O: call off the event loop). `fresh`: read it whatever the cache says."""
        if not fresh:
            hit = self.cached()
            if hit is not None:
                return hit
        stamp, started = self.stamp(), self._clock()
        target = self.path / CHECKPOINT_FILE_NAME if self.path.is_dir() else self.path
        try:
            raw = target.read_bytes()
        except FileNotFoundError:
            self._parsed = None
            return KubeletCheckpoint(entries=(), registered_devices={}, layout=None)
        except OSError as exc:
            raise KubeletCheckpointError(str(target), f"cannot read: {exc.strerror or exc}") from exc
        last = self._parsed
        if last is not None and last.raw == raw:
            ckpt = last.ckpt
        else:
            ckpt = parse_kubelet_checkpoint(raw, source=str(target))
            self.reads += 1
        if stamp is not None and stamp == self.stamp():  # not changed while it was read
            self._parsed = _Parsed(stamp, raw, ckpt, trusted=started - stamp[3] / 1e9 > RACY_S)
        else:
            self._parsed = None
        return ckpt
