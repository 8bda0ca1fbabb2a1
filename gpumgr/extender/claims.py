"""What a pod holds, read from its annotations: which node, and per container which cards (by minor).

A pod holds cards when it is not finished (Succeeded/Failed) and carries `tencent.com/predicate-gpu-idx-<i>`
for its GPU containers; the node is `spec.nodeName`, or `tencent.com/predicate-node` while it is not bound
yet. A bound pod whose predicate-node names another node holds nothing we can place: its annotations are stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.requests import podspec

FINISHED = frozenset({"Succeeded", "Failed"})


def pod_claim(pod: Mapping[str, Any]) -> Claim | None:
    """The cards the pod's annotations say it holds, or None."""
    if ((pod.get("status") or {}).get("phase")) in FINISHED:
        return None
    ann = podspec.pod_annotations(pod)
    bound = (pod.get("spec") or {}).get("nodeName") or ""
    named = ann.get(podspec.ANN_PREDICATE_NODE, "")
    if bound and named and named != bound:
        return None
    node = bound or named
    if not node:
        return None
    held = []
    containers = (pod.get("spec") or {}).get("containers") or []
    for i, c in enumerate(containers):
        minors = podspec.predicate_minors(pod, i)
        if not minors or not isinstance(c, dict):
            continue
        try:
            a = podspec.container_ask(c, i)
        except (ValueError, AttributeError):
            continue
        if a.cores <= 0:
            continue
        held.append(HeldCards(index=i, minors=tuple(minors), cores=a.cores, memory_units=a.memory_units))
    if not held:
        return None
    return Claim(node=node, held=tuple(held), predicate_time=ann.get(podspec.ANN_PREDICATE_TIME, ""))


@dataclass(frozen=True, slots=True)
class HeldCards:
    index: int  # container position in spec.containers
    minors: tuple[int, ...]  # /dev/nvidiaN numbers
    cores: int
    memory_units: int


@dataclass(frozen=True, slots=True)
class Claim:
    node: str
    held: tuple[HeldCards, ...]
    predicate_time: str  # the predicate-time annotation; matches a bind's assumption once it is observed
