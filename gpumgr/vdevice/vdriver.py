"""What the agent puts on the host for GPU containers to mount (the `--shim-dir`, gpu-manager's "vdriver"):

    <shim-dir>/lib64/libvcuda.so   the vCUDA shim, copied from the agent's image (`--shim-source`)
    <shim-dir>/driver/             the NVIDIA user-space driver libraries only, linked from `--driver-root`

Mounting only the NVIDIA libraries (not the whole host library directory) keeps the host's libc and friends
out of the container. Fractional containers are refused while the shim is missing: without it they would run
with no limits at all.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("gpumgr.vdriver")

SHIM_NAME = "libvcuda.so"
TMP_PREFIX = f".{SHIM_NAME}."
DRIVER_PATTERNS = ("libcuda.so*", "libcudadebugger.so*", "libnvidia-*.so*", "libnvcuvid.so*", "libnvoptix.so*")


def shim_path(shim_dir: Path) -> Path:
    return shim_dir / "lib64" / SHIM_NAME


def driver_dir(shim_dir: Path) -> Path:
    return shim_dir / "driver"


def install_shim(source: Path, shim_dir: Path) -> Path | None:
    """Copy the shim into place atomically (only when it differs). None when there is no source."""
    dest = shim_path(shim_dir)
    if not source.is_file():
        if dest.is_file():
            log.warning("shim source %s not found; keeping the installed %s", source, dest)
            return dest
        log.error("shim source %s not found and none installed at %s: fractional pods will be refused",
                  source, dest)
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_copies(dest)
    if dest.is_file() and dest.read_bytes() == source.read_bytes():
        return dest
    # Never written in place: processes in running containers have the installed file mapped (LD_PRELOAD), and a
    # file rewritten under a mapping changes (or, shorter, SIGBUSes) their code. A new file renamed over the old
    # name gives new processes the new shim while the old inode lives on, unnamed, until the last process that
    # maps it ends; the kernel then frees it (nothing for the agent to track or remove).
    tmp = dest.with_name(f"{TMP_PREFIX}{os.getpid()}.tmp")
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o755)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the new file whole on disk before its name replaces the old one
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("installed the vCUDA shim %s -> %s (processes already running keep the old one)", source, dest)
    return dest


def _remove_stale_copies(dest: Path) -> None:
    """Temporary copies an agent killed mid-install left behind (never mapped: only a finished copy is renamed)."""
    for stale in dest.parent.glob(f"{TMP_PREFIX}*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
            log.info("removed %s, left by an install that did not finish", stale)


def stage_driver(driver_root: Path, dest: Path) -> int:
    """Mirror the NVIDIA libraries of `driver_root` into `dest` (hard links, copies across file systems,
    symlinks kept relative). Returns how many entries it holds."""
    dest.mkdir(parents=True, exist_ok=True)
    if not driver_root.is_dir():
        log.warning("driver root %s does not exist: GPU containers get an empty driver directory", driver_root)
        return 0
    wanted = {e.name: e for e in driver_root.iterdir() if any(fnmatch.fnmatch(e.name, p) for p in DRIVER_PATTERNS)}
    for stale in dest.iterdir():
        if stale.name not in wanted:
            stale.unlink(missing_ok=True)
    for name, src in wanted.items():
        target = dest / name
        if src.is_symlink():
            link = os.readlink(src)
            if target.is_symlink() and os.readlink(target) == os.path.basename(link):
                continue
            target.unlink(missing_ok=True)
            os.symlink(os.path.basename(link), target)
        elif src.is_file():
            if target.exists() and not target.is_symlink() and os.path.samefile(src, target):
                continue
            target.unlink(missing_ok=True)
            try:
                os.link(src, target)
            except OSError:
                shutil.copy2(src, target)
    return len(wanted)
