"""What the node holds and uses right now: one snapshot of cards, holders and their GPU usage.

`UsageReader.snapshot()` blocks (NVML calls, cgroup files): call it off the event loop. It reads the live ledger
once (a commit replaces the ledger object whole, so one reference is one consistent state), each card's status
once, each holder's pod once, and matches each container's host PIDs (from its cgroup) against the NVML
processes of its cards. A PID that NVML lists more than once on a card (several samples, or both the compute and
the graphics list) is counted once, with its largest memory and SM figures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumgr.allocator.ledger import Allocation, CardState
from gpumgr.allocator.request import HUNDRED
from gpumgr.devices.backend import Backend
from gpumgr.devices.types import GPUStatus
from gpumgr.metrics.shim_status import ShimStatusReader
from gpumgr.node.cgroups import CgroupReader, qos_of
from gpumgr.node.limits import LimitsMemo
from gpumgr.node.state import NodeState
from gpumgr.requests.choices import Cordon

log = logging.getLogger("gpumgr.metrics")

MIB = 1 << 20
PodLookup = Callable[[str], Mapping[str, Any] | None]
NO_POD: Mapping[str, Any] = MappingProxyType({})  # one object, so the limits memo knows it again


class UsageReader:
    def __init__(self, state: NodeState, backend: Backend, pods: PodLookup, cgroups: CgroupReader | None = None,
                 shim: ShimStatusReader | None = None, cordon: Callable[[], Cordon] | None = None):
        self.state = state
        self.backend = backend
        self.pods = pods
        self.cgroups = cgroups if cgroups is not None else CgroupReader()
        self.shim = shim if shim is not None else ShimStatusReader()
        self.cordon = cordon  # the node's per-card cordon (requests.choices.CordonWatch), when the agent follows it
        # each share's limits, worked out again only when its allocation or its pod object changed (not at every
        # scrape); scrapes may run at once (/metric, /usage), each on its own thread
        self._limits = LimitsMemo(state.inventory, state.memory_unit_mib)
        self._limits_lock = threading.Lock()

    def snapshot(self) -> NodeSnapshot:
        t0 = time.perf_counter()
        state = self.state
        ledger = state.ledger
        inv = state.inventory
        statuses = {c.index: self._status(c.index) for c in ledger.cards}
        # a card that fell off the bus reports no processes: no usage figure for it, rather than a false zero
        per_card_procs = {i: _processes(s) for i, (s, _) in statuses.items() if s is not None and not s.lost}
        pods: dict[str, Mapping[str, Any] | None] = {}
        holders = [
            self._holder(a, ledger.cards, per_card_procs, pods)
            for a in sorted(ledger.allocations.values(), key=lambda a: a.key)
        ]
        with self._limits_lock:
            self._limits.keep_only(ledger.allocations)
        cordon = self.cordon() if self.cordon is not None else None
        cards = []
        for c in ledger.cards:
            g = inv.gpus[c.index]
            status, error = statuses[c.index]
            cards.append(CardSnapshot(
                index=c.index, uuid=g.uuid, model=g.name, memory_mib=c.memory_mib, healthy=c.healthy,
                reasons=tuple(sorted(state.health_reasons.get(c.index, ()))), mode=c.mode,
                allocated_cores=c.used_cores, allocated_memory_mib=c.memory_mib - c.free_memory_mib,
                free_cores=c.free_cores, free_memory_mib=c.free_memory_mib, holders=tuple(sorted(c.holders)),
                status=status, error=error, cordoned=None if cordon is None else c.index in cordon.cards,
            ))
        return NodeSnapshot(
            node=state.node_name, cards=tuple(cards), holders=tuple(holders),
            checkpoint_writes=state.checkpoint_writes, checkpoint_failures=state.checkpoint_failures,
            seconds=time.perf_counter() - t0, cordon_error=cordon.error if cordon is not None else "",
        )

    def _status(self, index: int) -> tuple[GPUStatus | None, str]:
        try:
            return self.backend.status(index), ""
        except Exception as e:  # a card NVML cannot read must not fail the whole scrape
            log.debug("status of GPU%d failed: %s", index, e)
            return None, f"{type(e).__name__}: {e}"

    def _pod(self, uid: str, cache: dict[str, Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
        if uid not in cache:
            try:
                cache[uid] = self.pods(uid) if uid else None
            except Exception as e:
                log.debug("pod lookup %s failed: %s", uid, e)
                cache[uid] = None
        return cache[uid]

    def _holder(self, a: Allocation, cards: list[CardState], procs: Mapping[int, Mapping[int, ProcessFigures]],
                pods: dict[str, Mapping[str, Any] | None]) -> HolderSnapshot:
        uid = a.pod_uid
        container = a.container
        pod = self._pod(uid, pods)
        container_id = _container_id(pod, container) if pod is not None else ""
        pids: tuple[int, ...] = ()
        pids_error = ""
        if not container_id:
            pids_error = "pod not found" if pod is None else f"container {container!r} has no ID (not started?)"
        else:
            try:
                pids = tuple(self.cgroups.pids(uid, container_id, qos_of(pod) if pod else None))
                if not pids:
                    pids_error = "no cgroup or no processes found"
            except (OSError, ValueError) as e:
                pids_error = f"{type(e).__name__}: {e}"
        whole = a.cores >= HUNDRED
        use: dict[int, CardUse] = {}
        wanted = set(pids)
        for i in a.cards:
            if i not in procs:
                continue  # status unknown: no figure rather than a false zero
            mine = [f for pid, f in procs[i].items() if pid in wanted]
            use[i] = CardUse(memory_bytes=sum(f.memory_bytes for f in mine), sm_util=sum(f.sm_util for f in mine))
        request_mib = sum(cards[i].memory_mib for i in a.cards if 0 <= i < len(cards)) if whole else a.memory_mib
        return HolderSnapshot(
            key=a.key, pod=a.pod if a.holder is not None else a.key, namespace=a.namespace, container=container,
            pod_uid=uid, cards=a.cards, cores=a.cores, memory_mib=a.memory_mib, request_memory_mib=request_mib,
            verified=a.verified, created=float(a.created) if a.created is not None else None,
            container_id=container_id, pids=pids, pids_error=pids_error, use=use,
            compute_modes=self.shim.modes(pids, container_id) if pids else {},
            compute_enforcement=self._enforcement(a, pod),
        )

    def _enforcement(self, a: Allocation, pod: Mapping[str, Any] | None) -> dict[str, str]:
        """Device UUID (a MIG UUID inside an instance) -> how its compute limit is enforced (process, gpm, none), as
        the container's limits say; {} when the container has no compute limit (whole cards or instances)."""
        if not 0 < a.cores < HUNDRED:
            return {}
        try:
            with self._limits_lock:
                limits = self._limits.get(a, pod if pod is not None else NO_POD)
        except (IndexError, ValueError) as e:  # an allocation naming a card the inventory lacks: nothing to say
            log.debug("limits of %s: %s", a.key, e)
            return {}
        slot = self.state.ledger.slots.get(a.mig) if a.mig else None
        if slot is not None and slot.uuid and limits.devices:  # a share inside an instance (one card): named as
            return {slot.uuid: limits.devices[0].compute}  # its shim names it, by MIG UUID
        return {d.uuid: d.compute for d in limits.devices}


def _processes(status: GPUStatus) -> dict[int, ProcessFigures]:
    out: dict[int, ProcessFigures] = {}
    for p in status.processes:
        seen = out.get(p.pid)
        if seen is None:
            out[p.pid] = ProcessFigures(p.used_memory_bytes, p.sm_util)
        else:
            out[p.pid] = ProcessFigures(max(seen.memory_bytes, p.used_memory_bytes), max(seen.sm_util, p.sm_util))
    return out


def _container_id(pod: Mapping[str, Any], container: str) -> str:
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            if isinstance(cs, Mapping) and cs.get("name") == container and cs.get("containerID"):
                return str(cs["containerID"])
    return ""


@dataclass(frozen=True)
class ProcessFigures:
    memory_bytes: int
    sm_util: int


@dataclass(frozen=True)
class CardUse:
    """One container's processes on one card."""

    memory_bytes: int
    sm_util: int  # percent of the card, summed over the container's processes


@dataclass(frozen=True)
class HolderSnapshot:
    key: str
    pod: str
    namespace: str
    container: str
    pod_uid: str
    cards: tuple[int, ...]
    cores: int  # vcuda-core request (100 = one whole card)
    memory_mib: int  # memory asked (fractional holders)
    request_memory_mib: int  # what the container may use: asked memory, or the cards' memory for whole cards
    verified: bool
    created: float | None
    container_id: str
    pids: tuple[int, ...]
    pids_error: str
    use: dict[int, CardUse] = field(default_factory=dict)  # card index -> usage, for cards whose status is known
    compute_modes: dict[str, str] = field(default_factory=dict)  # card UUID -> how the shim measures (shim_status)
    compute_enforcement: dict[str, str] = field(default_factory=dict)  # device UUID -> process|gpm|none (limits)

    @property
    def memory_bytes(self) -> int:
        return sum(u.memory_bytes for u in self.use.values())

    @property
    def sm_util(self) -> int:
        return sum(u.sm_util for u in self.use.values())


@dataclass(frozen=True)
class CardSnapshot:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    reasons: tuple[str, ...]
    mode: str
    allocated_cores: int
    allocated_memory_mib: int
    free_cores: int
    free_memory_mib: int
    holders: tuple[str, ...]
    status: GPUStatus | None
    error: str
    # takes no new pods (node annotation gpumgr.io/cordoned-gpus; holders keep running); None: cordon not followed
    cordoned: bool | None = None


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    cards: tuple[CardSnapshot, ...]
    holders: tuple[HolderSnapshot, ...]
    checkpoint_writes: int
    checkpoint_failures: int
    seconds: float
    cordon_error: str = ""  # the cordon annotation was not understood (then every card counts as cordoned)
