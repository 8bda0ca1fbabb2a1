"""Which host process is calling: a container's PID as the host sees it, found through /proc.

gRPC over a unix socket does not hand the peer's credentials to Python, so the shim sends its own PID (as its
PID namespace sees it) and the agent, which runs with the host's PID namespace, finds the host process whose
`NSpid` ends with that PID and whose cgroup belongs to the pod. Without the pod's cgroup there is no answer
(0): a PID alone could name any process on the host.

A walk reads every process's `status`: it costs real time on a busy host. `confirm` re-checks one known
answer with two reads, so a caller that remembers answers (one cache per vDevice socket, see server.py) walks
once per process, not once per call.
"""

from __future__ import annotations

from pathlib import Path

from gpumgr.requests.podspec import ascii_uint


def host_pid(proc_root: Path, ns_pid: int, pod_uid: str, known: int = 0) -> int:
    """The host PID of `ns_pid` inside the pod, or 0 when it cannot be told. `known`: a previous answer, tried
    first (two reads instead of a walk)."""
    if ns_pid <= 0:
        return 0
    if known > 0 and confirm(proc_root, known, ns_pid, pod_uid):
        return known
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        pid = ascii_uint(name, 10)
        if pid is None:
            continue
        if _ns_pid_of(entry) == ns_pid and _in_pod(entry, pod_uid):
            return pid
    return 0  # not found in the pod: the caller falls back to its own PID


def confirm(proc_root: Path, pid: int, ns_pid: int, pod_uid: str) -> bool:
    """Host process `pid` is still `ns_pid` in its namespace and still in the pod (PIDs are reused)."""
    entry = proc_root / str(pid)
    return _ns_pid_of(entry) == ns_pid and _in_pod(entry, pod_uid)


def in_container(proc_root: Path, pid: int, container_id: str) -> bool:
    cid = container_id.split("://")[-1]
    try:
        return cid in (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return False


def _ns_pid_of(entry: Path) -> int:
    """The last NSpid of a /proc entry (its PID in the innermost namespace), or -1."""
    try:
        status = (entry / "status").read_text(errors="replace")
    except OSError:
        return -1
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            found = ascii_uint(line.split()[-1], 10)
            return -1 if found is None else found
    return -1


def _in_pod(entry: Path, pod_uid: str) -> bool:
    try:
        cgroup = (entry / "cgroup").read_text(errors="replace")
    except OSError:
        return False
    return pod_uid in cgroup or pod_uid.replace("-", "_") in cgroup
