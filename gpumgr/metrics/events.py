"""The agent's own metrics: what happened (allocations, checkpoint writes, registrations, health), counted as it
happens. One `CollectorRegistry` per agent; never the process-wide default registry.

The agent calls these methods on its events; they are cheap and thread-safe. The node's state at scrape time
(cards, containers, usage) is produced by `gpumgr.metrics.collector.NodeCollector`, registered on the same
registry by `attach`.
"""

from __future__ import annotations

import re
import threading

from prometheus_client import CollectorRegistry, Counter, Histogram

from gpumgr.metrics.collector import NodeCollector
from gpumgr.metrics.usage import UsageReader

ALLOCATE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLUG = re.compile(r"[^a-z0-9]+")


def slug(reason: str, limit: int = 40) -> str:
    """A bounded label value for a reason: the text before any `:`, lower-case, runs of anything but `[a-z0-9]`
    turned into `_` (`"no fit: 2 cards asked"` → `no_fit`, `"XID 79"` → `xid_79`).

    Reasons are free text in logs; callers pass a short kind (`no_fit`, `unhealthy`, `xid`, `temperature`) so
    that a label value never becomes a new series per message.
    """
    head = reason.split(":", 1)[0].strip().lower()
    return _SLUG.sub("_", head).strip("_")[:limit] or "unknown"


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._allocate_seconds = Histogram(
            "gpumgr_allocate_duration_seconds", "Time to answer a device-plugin Allocate, success or failure.",
            buckets=ALLOCATE_BUCKETS, registry=r)
        self._allocations = Counter("gpumgr_allocations", "Allocate calls answered with devices.", registry=r)
        self._allocation_failures = Counter(
            "gpumgr_allocation_failures", "Allocate calls refused, by reason.", ["reason"], registry=r)
        self._reregistrations = Counter(
            "gpumgr_kubelet_reregistrations", "Device-plugin registrations with the kubelet after the first "
            "(kubelet restarts), by resource.", ["resource"], registry=r)
        self._vdevice_registrations = Counter(
            "gpumgr_vdevice_registrations", "RegisterVDevice calls from containers' shims.", registry=r)
        self._health_transitions = Counter(
            "gpumgr_gpu_health_transitions", "Cards turning unhealthy or healthy, by card, direction and reason.",
            ["gpu", "to", "reason"], registry=r)
        self._lock = threading.Lock()
        self._xid: dict[int, int] = {}
        self._checkpoint_ok = 0
        self._checkpoint_failed = 0
        self._collector: NodeCollector | None = None

    # -- events (called by the agent) ---------------------------------------------------------------------------
    def observe_allocate(self, seconds: float, ok: bool, reason: str = "") -> None:
        """One Allocate answered: its latency, and on failure a short reason (`no_fit`, `unhealthy`, ...)."""
        self._allocate_seconds.observe(max(0.0, seconds))
        if ok:
            self._allocations.inc()
        else:
            self._allocation_failures.labels(reason=slug(reason)).inc()

    def checkpoint_write(self, ok: bool) -> None:
        """A checkpoint write NOT made by `NodeState.commit` (those are counted from the node state itself)."""
        with self._lock:
            if ok:
                self._checkpoint_ok += 1
            else:
                self._checkpoint_failed += 1

    def reregistration(self, resource: str) -> None:
        self._reregistrations.labels(resource=resource).inc()

    def vdevice_registration(self) -> None:
        self._vdevice_registrations.inc()

    def health_transition(self, index: int, healthy: bool, reason: str) -> None:
        """Card `index` turned healthy or unhealthy (its health gauge itself is read from the node state)."""
        self._health_transitions.labels(
            gpu=f"gpu{index}", to="healthy" if healthy else "unhealthy", reason=slug(reason)).inc()

    def xid_error(self, index: int, code: int) -> None:
        """An XID error on card `index` (counted whether or not the code makes the card unhealthy)."""
        with self._lock:
            self._xid[index] = self._xid.get(index, 0) + 1

    # -- reads ----------------------------------------------------------------------------------------------------
    def xid_counts(self) -> dict[int, int]:
        with self._lock:
            return dict(self._xid)

    def checkpoint_extra(self) -> tuple[int, int]:
        """(ok, failed) writes reported through `checkpoint_write`."""
        with self._lock:
            return self._checkpoint_ok, self._checkpoint_failed

    # -- the node, at scrape time ----------------------------------------------------------------------------------
    def attach(self, reader: UsageReader) -> None:
        """Register the scrape-time collector of the node that `reader` reads (once)."""
        if self._collector is not None:
            if self._collector.reader is reader:
                return
            raise ValueError("these metrics already collect another node")
        self._collector = NodeCollector(reader, self)
        self.registry.register(self._collector)
