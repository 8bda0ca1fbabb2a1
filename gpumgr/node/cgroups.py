"""Host PIDs of a container, read from its cgroup.

The container's cgroup directory is found by searching the layouts the kubelet and the runtimes really produce,
not by assuming one:

- cgroup v2 (unified, `cgroup.controllers` at the root) and v1 (the `memory`, `pids` or `cpu,cpuacct`
  hierarchy; the v2 `unified` mount of a hybrid host last);
- the systemd driver (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
  cri-containerd-<id>.scope`; Guaranteed pods sit directly under `kubepods.slice` as `kubepods-pod<uid>.slice`)
  and the cgroupfs driver (`kubepods/burstable/pod<uid>/<id>`; Guaranteed: `kubepods/pod<uid>/<id>`);
- containerd (`cri-containerd-<id>.scope` or `<id>`), CRI-O (`crio-<id>.scope` or `crio-<id>`; never the
  `crio-conmon-<id>` monitor) and Docker (`docker-<id>.scope` or `<id>`) naming.

When the pod is not at a known place (a kubelet started with `--cgroup-root`, as in kind), a bounded search
below the hierarchy finds the pod's directory by name. The PIDs are those of every `cgroup.procs` at and below
the container's directory (runtimes such as crun nest a `container/` cgroup), sorted and de-duplicated.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumgr.requests.podspec import ascii_uint

DEFAULT_ROOT = "/sys/fs/cgroup"
V1_HIERARCHIES = ("memory", "pids", "cpu,cpuacct", "cpuacct,cpu", "cpuacct", "cpu")
QOS_LEVELS = ("guaranteed", "burstable", "besteffort")
SEARCH_DEPTH = 5
CACHE_LIMIT = 4096

_UID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_CID = re.compile(r"^[0-9a-zA-Z]{12,128}$")
_QOS = {"guaranteed": "guaranteed", "burstable": "burstable", "besteffort": "besteffort"}


class CgroupInputError(ValueError):
    """A pod UID or container ID that cannot name a cgroup (empty, malformed, or trying to leave the tree)."""


def parse_container_id(value: str) -> ContainerRef:
    """`containerd://<id>`, `cri-o://<id>`, `docker://<id>` (as in a pod's containerStatuses), or a bare ID."""
    runtime, sep, cid = value.strip().partition("://")
    if not sep:
        runtime, cid = "", runtime
    if not _CID.match(cid):
        raise CgroupInputError(f"container ID {value!r} is not <runtime>://<hex id>")
    return ContainerRef(runtime=runtime, id=cid.lower())


def qos_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's QoS class from `status.qosClass`, lower-case (`guaranteed`, `burstable`, `besteffort`), or None."""
    status = pod.get("status") or {}
    value = status.get("qosClass") if isinstance(status, Mapping) else None
    return _QOS.get(str(value).lower()) if value else None


def read_pids(directory: Path) -> list[int]:
    """PIDs in every `cgroup.procs` at and below `directory`, sorted and de-duplicated.

    Cgroups that vanish while being read (a process or container exiting) are skipped; other errors, such as
    no permission, are raised.
    """
    found: set[int] = set()
    stack = [str(directory)]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue
        for e in entries:
            if e.name == "cgroup.procs":
                try:
                    with open(e.path, encoding="ascii", errors="replace") as f:
                        text = f.read()
                except FileNotFoundError:
                    continue
                found.update(n for n in (ascii_uint(tok, 10) for tok in text.split()) if n is not None)
            elif e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return sorted(found)


class CgroupReader:
    """Finds containers' cgroups below `root` and reads their PIDs. Remembers where it found each container."""

    def __init__(self, root: str | Path = DEFAULT_ROOT):
        self.root = Path(root)
        self._found: dict[tuple[str, str], Path] = {}

    def hierarchies(self) -> list[Path]:
        """The hierarchies to search, in order: the unified root (v2), then v1 controllers, then a hybrid's v2."""
        out: list[Path] = []
        if (self.root / "cgroup.controllers").exists():
            out.append(self.root)
        out += [self.root / h for h in V1_HIERARCHIES if (self.root / h).is_dir()]
        if (self.root / "unified").is_dir():
            out.append(self.root / "unified")
        return out

    def container_dir(self, pod_uid: str, container_id: str, qos: str | None = None) -> Path | None:
        """The container's cgroup directory, or None when it is in none of the layouts (not started, or gone)."""
        uid = _check_uid(pod_uid)
        ref = parse_container_id(container_id)
        key = (uid, ref.id)
        hit = self._found.get(key)
        if hit is not None and hit.is_dir():
            return hit
        self._found.pop(key, None)
        levels = (_QOS[qos.lower()],) if qos and qos.lower() in _QOS else QOS_LEVELS
        for base in self.hierarchies():
            pod_dirs = [base / p for p in _pod_paths(uid, levels)]
            pod_dirs = [p for p in pod_dirs if p.is_dir()] or _search_pod(base, uid)
            for pod_dir in pod_dirs:
                found = _container_in(pod_dir, ref)
                if found is not None:
                    if len(self._found) >= CACHE_LIMIT:
                        self._found.clear()
                    self._found[key] = found
                    return found
        return None

    def pids(self, pod_uid: str, container_id: str, qos: str | None = None) -> list[int]:
        """Host PIDs of the container, sorted and unique; [] when its cgroup is not found."""
        d = self.container_dir(pod_uid, container_id, qos)
        return read_pids(d) if d is not None else []


# -- the layouts ------------------------------------------------------------------------------------------------
def _check_uid(pod_uid: str) -> str:
    uid = pod_uid.strip().lower()
    if not _UID.match(uid):
        raise CgroupInputError(f"pod UID {pod_uid!r} is not a UUID")
    return uid


def _pod_paths(uid: str, levels: tuple[str, ...]) -> list[str]:
    """Pod directories relative to a hierarchy, for both cgroup drivers and the given QoS levels."""
    us = uid.replace("-", "_")
    out: list[str] = []
    for q in levels:
        if q == "guaranteed":
            out += [f"kubepods.slice/kubepods-pod{us}.slice", f"kubepods/pod{uid}"]
        else:
            out += [f"kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{us}.slice", f"kubepods/{q}/pod{uid}"]
    return out


def _pod_dir_names(uid: str) -> tuple[str, str]:
    """(cgroupfs name, systemd suffix) of a pod's directory."""
    return f"pod{uid}", f"-pod{uid.replace('-', '_')}.slice"


def _search_pod(base: Path, uid: str) -> list[Path]:
    """Pod directories anywhere in the kubelet's part of a hierarchy (e.g. `kubelet.slice/kubelet-kubepods.slice/
    ...`), descending only into directories whose names speak of kube, to a bounded depth."""
    plain, suffix = _pod_dir_names(uid)
    found: list[Path] = []
    level = [str(base)]
    for _ in range(SEARCH_DEPTH):
        nxt: list[str] = []
        for d in level:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if not e.is_dir(follow_symlinks=False):
                    continue
                name = e.name.lower()
                if name == plain or name.endswith(suffix):
                    found.append(Path(e.path))
                elif "kube" in name and not _looks_like_pod(name):  # pods do not nest: never look inside one
                    nxt.append(e.path)
        if found or not nxt:
            break
        level = nxt
    return found


def _looks_like_pod(name: str) -> bool:
    return name.startswith("pod") or "-pod" in name


def _container_names(ref: ContainerRef) -> list[str]:
    i = ref.id
    names = [f"cri-containerd-{i}.scope", f"crio-{i}.scope", f"docker-{i}.scope", i, f"crio-{i}", f"docker-{i}"]
    preferred = {"containerd": f"cri-containerd-{i}.scope", "cri-o": f"crio-{i}.scope", "docker": f"docker-{i}.scope"}
    first = preferred.get(ref.runtime)
    return [first, *(n for n in names if n != first)] if first else names


def _container_in(pod_dir: Path, ref: ContainerRef) -> Path | None:
    for name in _container_names(ref):
        p = pod_dir / name
        if p.is_dir():
            return p
    # another runtime's prefix (`<runtime>-<id>.scope`); never a conmon/monitor cgroup
    try:
        entries = list(os.scandir(pod_dir))
    except OSError:
        return None
    for e in entries:
        name = e.name.lower()
        if "conmon" in name or not e.is_dir(follow_symlinks=False):
            continue
        if name.endswith(f"-{ref.id}.scope") or name.endswith(f"-{ref.id}"):
            return Path(e.path)
    return None


@dataclass(frozen=True)
class ContainerRef:
    runtime: str  # "containerd", "cri-o", "docker", or "" for a bare ID
    id: str
