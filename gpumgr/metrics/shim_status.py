"""How each container's vCUDA shim measures its compute limit, from the status file the shim writes.

The shim (vcuda/src/vc_status.c) writes `vcuda-v<N>-<key>.status` next to its shared state in the container's
`/dev/shm` (its `VCUDA_SHARED_DIR`) when the way it measures a device's use changes:

    version=1
    container_id=<64 hex, or empty>
    device<slot>_uuid=GPU-...  (MIG-... for a share inside a MIG instance)
    device<slot>_compute=process|device|gpm|unthrottled

`process`: NVML per-process utilisation (normal); `device`: the card's utilisation (the driver has no per-process
figures); `gpm`: a MIG instance's GPM SM utilisation (inside MIG on Hopper and later, normal there); `unthrottled`:
no measure at all, so the compute limit is not enforced. No file means `process`.

The agent reads it through `/proc/<host pid>/root/dev/shm`, for one of the container's own PIDs. The directory is
the container's to write, so everything is bounded (PIDs tried, names listed, files read, bytes per file), the path
is walked one component at a time from `/proc/<pid>/root` with no symlink followed at any step (an absolute link at
`dev` or `dev/shm` would otherwise resolve against the agent's own root), and only well-formed UUIDs and known modes
come out. Each container's answer is reused for CACHE_S seconds (keyed by container id and the PIDs tried), so
however often /metric is scraped, the agent walks a container's directory at most once per window.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MODES = ("process", "device", "gpm", "unthrottled")
_NAME = re.compile(r"^vcuda-v[0-9]{1,4}-[0-9a-f]{1,32}-[0-9a-f]{1,32}\.status$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]{8,64}$")
_KEY = re.compile(r"^device([0-9]{1,2})_(uuid|compute)$")
MAX_PIDS = 4
MAX_ENTRIES = 512
MAX_FILES = 16
MAX_BYTES = 4096
MAX_LOGGED = 4096
CACHE_S = 10.0  # seconds one container's answer is reused
MAX_CACHED = 1024  # containers whose answers are held

log = logging.getLogger("gpumgr.metrics")


class ShimStatusReader:
    """Reads are cached for `cache_s` seconds per (container, PIDs): a scraper calling /metric in a loop makes the
    agent walk each container's directory at most once per window. At most MAX_CACHED answers are kept; those of
    containers no longer asked about expire and are dropped."""

    def __init__(self, proc_root: Path | str = "/proc", shared_dir: str = "dev/shm", cache_s: float = CACHE_S,
                 clock: Callable[[], float] = time.monotonic):
        self.proc_root = Path(proc_root)
        parts = [p for p in shared_dir.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise ValueError(f"shared_dir {shared_dir!r}: must be a path below the container's root, without . or ..")
        self.shared_parts = parts
        self._logged: set[tuple[str, str, str]] = set()  # (container id, uuid, mode) already in the log
        self._cache_s = cache_s
        self._clock = clock
        self._cache: dict[tuple[str, tuple[int, ...]], tuple[float, dict[str, str]]] = {}  # key -> (read at, modes)
        self._swept = clock()
        self._lock = threading.Lock()  # scrapes run in an executor: the cache is shared by its threads

    def modes(self, pids: Sequence[int], container_id: str) -> dict[str, str]:
        """Card UUID -> compute mode for the container whose processes are `pids` ({} when nothing says)."""
        tried = tuple(int(p) for p in list(pids)[:MAX_PIDS])
        key = (container_id, tried)
        now = self._clock()
        with self._lock:
            self._sweep(now)
            hit = self._cache.get(key)
            if hit is not None and 0 <= now - hit[0] < self._cache_s:
                return dict(hit[1])
        found = self._read(tried, container_id)
        with self._lock:
            self._cache.pop(key, None)  # re-inserted last: the dict's order is the order of reads
            self._cache[key] = (now, found)
            while len(self._cache) > MAX_CACHED:
                del self._cache[next(iter(self._cache))]
        return dict(found)

    def cached(self) -> int:
        """How many containers' answers are held."""
        with self._lock:
            return len(self._cache)

    def _sweep(self, now: float) -> None:
        """Once per window, drop the answers that have expired (containers that are gone are no longer asked)."""
        if 0 <= now - self._swept < self._cache_s:
            return
        self._swept = now
        for key in [k for k, (at, _) in self._cache.items() if not 0 <= now - at < self._cache_s]:
            del self._cache[key]

    def _read(self, pids: Sequence[int], container_id: str) -> dict[str, str]:
        want = container_id.rsplit("://", 1)[-1].lower()
        for pid in pids:
            found = self._from_pid(pid, want)
            if found is not None:
                self._log_degraded(container_id, found)
                return found
        return {}

    def _log_degraded(self, container_id: str, modes: dict[str, str]) -> None:
        """One log line per container, card and degraded mode, the first time a scrape sees it."""
        for uuid, mode in sorted(modes.items()):
            key = (container_id, uuid, mode)
            with self._lock:  # scrapes run on several threads: one line each, not one per thread
                if mode in ("process", "gpm") or key in self._logged or len(self._logged) >= MAX_LOGGED:
                    continue
                self._logged.add(key)
            if mode == "unthrottled":
                log.warning("container %s on %s: the vCUDA shim has no utilisation measure, so its compute limit "
                            "is not enforced", container_id, uuid)
            else:
                log.warning("container %s on %s: NVML has no per-process utilisation; the vCUDA shim limits compute "
                            "from the card's utilisation", container_id, uuid)

    def _from_pid(self, pid: int, want: str) -> dict[str, str] | None:
        dfd = _open_dir_in_root(self.proc_root / str(int(pid)) / "root", self.shared_parts)
        if dfd is None:
            return None
        try:
            return self._from_dir(dfd, want)
        finally:
            os.close(dfd)

    def _from_dir(self, dfd: int, want: str) -> dict[str, str] | None:
        names: list[str] = []
        try:
            with os.scandir(dfd) as it:
                for n, entry in enumerate(it):
                    if n >= MAX_ENTRIES or len(names) >= MAX_FILES:
                        break
                    if _NAME.match(entry.name):
                        names.append(entry.name)
        except OSError:
            return None
        out: dict[str, str] = {}
        seen = False
        for name in sorted(names):
            doc = _read(dfd, name)
            if doc is None:
                continue
            cid = doc.get("container_id", "").lower()
            if cid and want and cid != want:
                continue  # another container of the pod, sharing /dev/shm
            seen = True
            out.update(_devices(doc))
        return out if seen else None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir_in_root(root: Path, parts: Sequence[str]) -> int | None:
    """A descriptor of root/parts[0]/parts[1]/..., opened one component at a time relative to the last, with no
    symlink followed at any step (`root` itself, /proc/<pid>/root, is the kernel's link into the container).
    None if any step is not a real directory."""
    try:
        fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return None
    for part in parts:
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = nxt
    return fd


def _read(dfd: int, name: str) -> dict[str, str] | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None
    doc: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, val = line.partition("=")
        if sep:
            doc[key.strip()] = val.strip()
    return doc if doc.get("version") == "1" else None


def _devices(doc: dict[str, str]) -> dict[str, str]:
    uuids: dict[str, str] = {}
    modes: dict[str, str] = {}
    for key, val in doc.items():
        m = _KEY.match(key)
        if not m:
            continue
        if m.group(2) == "uuid" and _UUID.match(val):
            uuids[m.group(1)] = val
        elif m.group(2) == "compute" and val in MODES:
            modes[m.group(1)] = val
    return {uuids[s]: modes[s] for s in uuids if s in modes}
