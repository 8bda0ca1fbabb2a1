"""Writing a file whole: the first step of every temp-file-then-rename write (checkpoint, limits, CDI specs)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path


def write_new(path: Path, data: bytes, mode: int, *, fsync: bool) -> None:
    """Create or truncate `path` (never through a symlink) and write every byte of `data` to it, fsynced when asked.
    On any failure (a short write on a full disk, an I/O error) the file is removed and the OSError raised, so a
    rename that follows never puts a cut-off file in place."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            _write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):  # the first error is the one to report
            path.unlink(missing_ok=True)
        raise


def _write_all(fd: int, data: bytes) -> None:
    """os.write may write less than asked (a signal, a full disk): go on until every byte is written; a write
    that cannot progress raises (ENOSPC, EFBIG, EIO)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[n:]
