"""Builds cgroup trees on disk as the kubelet and the runtimes lay them out (used by the tests and the bench).

Each tree also holds what must NOT be counted: the pod's sandbox (pause) container, CRI-O's conmon monitor, and
another pod's container.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

VERSIONS = ("v1", "v2")
DRIVERS = ("systemd", "cgroupfs")
RUNTIMES = ("containerd", "crio", "docker")
QOS = ("guaranteed", "burstable", "besteffort")
SCHEME = {"containerd": "containerd", "crio": "cri-o", "docker": "docker"}


def hierarchy(root: Path, version: str, v1_controller: str = "memory") -> Path:
    """The directory under which `kubepods` lives; marks `root` as a v2 root when version is v2."""
    root.mkdir(parents=True, exist_ok=True)
    if version == "v2":
        (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
        return root
    base = root / v1_controller
    base.mkdir(exist_ok=True)
    return base


def pod_dir(base: Path, driver: str, qos: str, uid: str) -> Path:
    if driver == "systemd":
        us = uid.replace("-", "_")
        if qos == "guaranteed":
            return base / "kubepods.slice" / f"kubepods-pod{us}.slice"
        return base / "kubepods.slice" / f"kubepods-{qos}.slice" / f"kubepods-{qos}-pod{us}.slice"
    if qos == "guaranteed":
        return base / "kubepods" / f"pod{uid}"
    return base / "kubepods" / qos / f"pod{uid}"


def container_name(driver: str, runtime: str, cid: str) -> str:
    if driver == "systemd":
        prefix = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}[runtime]
        return f"{prefix}-{cid}.scope"
    return f"crio-{cid}" if runtime == "crio" else cid


def write_procs(d: Path, pids: Iterable[int]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def add_container(base: Path, driver: str, runtime: str, qos: str, uid: str, cid: str, pids: Iterable[int],
                  sandbox_pid: int = 1) -> Path:
    """The container's cgroup with `pids`, beside the pod's sandbox (and, for CRI-O, its conmon)."""
    pod = pod_dir(base, driver, qos, uid)
    write_procs(pod, [])
    sandbox = "f" * 64
    write_procs(pod / container_name(driver, runtime, sandbox), [sandbox_pid])
    if runtime == "crio":
        conmon = f"crio-conmon-{cid}.scope" if driver == "systemd" else f"crio-conmon-{cid}"
        write_procs(pod / conmon, [sandbox_pid + 1])
    d = pod / container_name(driver, runtime, cid)
    write_procs(d, pids)
    return d


def container_id(n: int) -> str:
    return f"{n:064x}"


def pod_uid(n: int) -> str:
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
