"""Which pod and container an allocation is for.

Allocate carries only device IDs. At Allocate the binder *guesses* among this node's pending GPU pods (oldest
extender decision first), preferring the pod whose recorded cards (`tencent.com/predicate-gpu-idx-<i>`, written
by the extender) are exactly the cards the kubelet chose. The guess only decides the memory written in the
ledger and the card choice offered in GetPreferredAllocation. PreStartContainer then learns the exact owner
from the kubelet's checkpoint and repairs any wrong guess before a limit is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.allocator.ledger import in_bounds
from gpumgr.devices.types import Inventory
from gpumgr.requests import podspec


def is_live(pod: Mapping[str, Any]) -> bool:
    """Holds its devices: not finished, not failed (a failed admission frees them)."""
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return phase not in ("Succeeded", "Failed")


def candidates(pods: Iterable[Mapping[str, Any]], inv: Inventory, cores: int,
               taken: set[tuple[str, str]]) -> list[Candidate]:
    """Pending GPU containers asking exactly `cores`, not already holding an allocation, oldest decision first."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if status.get("phase", "Pending") != "Pending" or meta.get("deletionTimestamp"):
            continue
        ann = meta.get("annotations") or {}
        if ann.get(podspec.ANN_ASSIGNED) == "true":
            continue
        uid = str(meta.get("uid", ""))
        try:
            asks = podspec.gpu_containers(pod, include_init=True)
        except ValueError:
            continue
        for ask in asks:
            if ask.cores != cores or (uid, ask.name) in taken:
                continue
            if ask.cores < 100 and not in_bounds("memory_units", ask.memory_units):
                continue  # more memory than the ledger records: it fits on no card
            recorded = None
            if not ask.init:
                minors = podspec.predicate_minors(pod, ask.index)
                if minors is not None:
                    by_minor = {g.minor: g.index for g in inv.gpus}
                    if all(m in by_minor for m in minors):
                        recorded = tuple(sorted(by_minor[m] for m in minors))
            order = ann.get(podspec.ANN_PREDICATE_TIME) or ""
            out.append(Candidate(pod=pod, ask=ask, recorded=recorded,
                                 order=(0 if order.isdigit() else 1, int(order) if order.isdigit() else 0,
                                        str(meta.get("creationTimestamp", "")), str(meta.get("namespace", "")),
                                        str(meta.get("name", "")), 0 if ask.init else 1, ask.index)))
    return sorted(out, key=lambda c: c.order)


def pick(cands: list[Candidate], cards: tuple[int, ...]) -> Candidate | None:
    """The candidate whose recorded cards are these cards, else the first without a contrary record, else the first."""
    for c in cands:
        if c.recorded == tuple(sorted(cards)):
            return c
    for c in cands:
        if c.recorded is None:
            return c
    return cands[0] if cands else None


def find_container(pod: Mapping[str, Any], name: str) -> podspec.ContainerAsk | None:
    for ask in podspec.gpu_containers(pod, include_init=True):
        if ask.name == name:
            return ask
    return None


def app_owner(owners: list[tuple[str, str]], pod: Mapping[str, Any] | None) -> tuple[str, str]:
    """Of the containers the kubelet lists for one set of device IDs (an app container reusing all of an init
    container's devices), the app container owns them; otherwise the last listed."""
    app = {c.get("name") for c in ((pod or {}).get("spec") or {}).get("containers") or []}
    return next((o for o in owners if o[1] in app), owners[-1])


def core_ceiling(pod: Mapping[str, Any]) -> int | None:
    """`tencent.com/vcuda-core-limit`: the soft-limit ceiling in percent, or None when absent or malformed."""
    raw = podspec.pod_annotations(pod).get(podspec.ANN_CORE_LIMIT)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        return None
    return max(1, min(100, value))


@dataclass(frozen=True)
class Candidate:
    pod: Mapping[str, Any]
    ask: podspec.ContainerAsk
    recorded: tuple[int, ...] | None  # card indices the extender recorded for this container
    order: tuple[Any, ...]

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace", "default"))

    @property
    def name(self) -> str:
        return str(self.pod["metadata"].get("name", ""))
