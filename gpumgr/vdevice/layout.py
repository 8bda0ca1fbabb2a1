"""Where a container's vDevice directory lives on the host, and what is in it.

Mounts are fixed when Allocate answers, before the pod is verified, so the directory is keyed by what Allocate
knows for certain: the allocation's own vcuda-core device IDs (`allocation_key`). PreStartContainer, once the
kubelet checkpoint has named the exact pod and container, writes the `limits` file and starts `vcuda.sock`
there. A wrong guess at Allocate can therefore never leave a container with another pod's directory.

    <root>/<key>/            0755, mounted read-only at /etc/vcuda in that one container
    <root>/<key>/limits      0644, see limits.py
    <root>/<key>/vcuda.sock  0666, the vDevice gRPC service
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from gpumgr.files.write import write_new
from gpumgr.vdevice.limits import Limits

SOCKET = "vcuda.sock"
LIMITS = "limits"
_KEY = re.compile(r"^a[0-9a-f]{24}$")
_UID = re.compile(r"^[0-9a-zA-Z][0-9a-zA-Z-]{0,62}$")
_CONTAINER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_CONTAINER_ID = re.compile(r"^([a-z0-9-]+://)?[0-9a-f]{12,128}$")


class BadName(ValueError):
    """A pod UID, container name, container ID or key that must not be used in a path."""


def allocation_key(core_device_ids: Iterable[str]) -> str:
    return _key_of(tuple(core_device_ids))


@functools.lru_cache(maxsize=4096)
def _key_of(ids: tuple[str, ...]) -> str:
    # memoized: the same IDs are keyed again on every Allocate and reconcile (about 1000 times per admission)
    digest = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()
    return "a" + digest[:24]


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise BadName(f"not an allocation key: {key!r}")
    return key


def check_pod_uid(uid: str) -> str:
    if not _UID.match(uid):
        raise BadName(f"not a pod UID: {uid!r}")
    return uid


def check_container_name(name: str) -> str:
    if not _CONTAINER.match(name):
        raise BadName(f"not a container name (DNS-1123 label): {name!r}")
    return name


def check_container_id(cid: str) -> str:
    if not _CONTAINER_ID.match(cid):
        raise BadName(f"not a container ID: {cid!r}")
    return cid


class VDeviceLayout:
    def __init__(self, root: Path | str):
        self.root = Path(root)

    def dir_for(self, key: str) -> Path:
        return self.root / check_key(key)

    def socket_for(self, key: str) -> Path:
        return self.dir_for(key) / SOCKET

    def prepare(self, key: str) -> Path:
        d = self.dir_for(key)
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        os.utime(d)  # handed out now: the orphan sweep spares a directory by its age, so a reused one is young again
        return d

    def write_limits(self, key: str, limits: Limits) -> Path:
        check_pod_uid(limits.pod_uid)
        check_container_name(limits.container_name)
        d = self.prepare(key)
        tmp = d / f".{LIMITS}.tmp"
        write_new(tmp, limits.to_text().encode(), 0o644, fsync=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, d / LIMITS)
        return d / LIMITS

    def remove(self, key: str) -> None:
        shutil.rmtree(self.dir_for(key), ignore_errors=True)

    def age_s(self, key: str) -> float:
        """Seconds since the key's directory was made (0 if it does not exist)."""
        import time

        try:
            return max(0.0, time.time() - self.dir_for(key).stat().st_mtime)
        except OSError:
            return 0.0

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _KEY.match(p.name))
