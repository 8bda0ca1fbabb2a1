"""Which host process is calling: a container's PID as the host sees it, found through /proc.

gRPC over a unix socket does not hand the peer's credentials to Python, so the shim sends its own PID (as its
PID namespace sees it) and the agent, which runs with the host's PID namespace, finds the host process whose
`NSpid` ends with that PID and whose cgroup belongs to the pod. Without the pod's cgroup there is no answer
(0): a PID alone could name any process on the host.
"""

from __future__ import annotations

from pathlib import Path


def host_pid(proc_root: Path, ns_pid: int, pod_uid: str) -> int:
    """The host PID of `ns_pid` inside the pod, or 0 when it cannot be told."""
    if ns_pid <= 0:
        return 0
    uid_forms = {pod_uid, pod_uid.replace("-", "_")}
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), None)
        if not nspid or int(nspid[-1]) != ns_pid:
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if any(u in cgroup for u in uid_forms):
            return int(entry.name)
    return 0  # not found in the pod: the caller falls back to its own PID
