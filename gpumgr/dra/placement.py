"""Is a claim for a pod of this node? The kubelet prepares a claim for the pod it is starting, so a claim whose
every consumer (status.reservedFor) is bound to another node has no business here: someone allocated it on this
node's pool for pods elsewhere. It is refused, naming the pods and where they are.

A pod counts as here when this node's pod cache holds it (the agent watches its own node's pods), or else when a
live read of the pod by namespace and name (the claim's namespace: consumers share it) has the reserved UID and
`spec.nodeName` of this node: the kubelet may prepare for a pod the watch has not delivered yet. At most
MAX_READS pods are read, all at once within one deadline; a pod not found, not readable, or beyond that bound
counts as elsewhere (the kubelet retries, and by then its pod is in the cache).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gpumgr.dra.claims import MAX_NAME_SHOWN, MAX_NAMED, ClaimError, PodRef

GetPod = Callable[[str, str], Awaitable[dict[str, Any] | None]]  # (namespace, name) -> pod, None when not found
CachedPod = Callable[[str], dict[str, Any] | None]  # uid -> a pod of this node, None when unknown
MAX_READS = 8  # live reads per claim


async def require_pod_here(label: str, namespace: str, pods: Sequence[PodRef], node: str, cached: CachedPod | None,
                           get_pod: GetPod, timeout_s: float) -> None:
    """Return when one of `pods` is bound to `node`; else raise ClaimError naming the pods and their nodes."""
    if cached is not None and any(_node_of(cached(p.uid), p.uid) == node for p in pods):
        return
    to_read = [p for p in pods if p.name][:MAX_READS]
    where: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout_s):
            found = await asyncio.gather(*(get_pod(namespace, p.name) for p in to_read), return_exceptions=True)
    except TimeoutError:
        found = [TimeoutError()] * len(to_read)
    for p, got in zip(to_read, found, strict=True):
        if isinstance(got, BaseException):
            where[p.uid] = "could not be read"
            continue
        at = _node_of(got, p.uid)
        if at == node:
            return
        where[p.uid] = f"on node {at[:MAX_NAME_SHOWN]}" if at else ("not bound to a node" if at == "" else "not found")
    shown = [f"{(p.name or p.uid)[:MAX_NAME_SHOWN]} ({where.get(p.uid, 'not on this node')})"
             for p in pods[:MAX_NAMED]]
    more = len(pods) - len(shown)
    raise ClaimError(f"{label} is reserved only for pods that are not on this node {node}: {', '.join(shown)}"
                     + (f" and {more} more" if more else "")
                     + "; a node prepares claims for its own pods only")


def _node_of(pod: dict[str, Any] | None, uid: str) -> str | None:
    """The pod's node ("" when not bound), or None when there is no such pod with this UID."""
    if not isinstance(pod, dict):
        return None
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or meta.get("uid") != uid:
        return None
    at = spec.get("nodeName") if isinstance(spec, dict) else None
    return at if isinstance(at, str) else ""
