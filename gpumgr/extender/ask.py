"""What a pod asks for: its GPU containers (cores, memory units) and its GPU model constraints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.requests import podspec
from gpumgr.requests.choices import NO_CHOICES, ChoiceError, Choices, pod_choices_of


class AskError(ValueError):
    """The pod's resource values cannot be read (not whole-number quantities)."""


def pod_ask(pod: Mapping[str, Any]) -> PodAsk:
    """Read a pod (API JSON). Raises AskError when a vcuda quantity is not a whole number."""
    spec = pod.get("spec") or {}
    containers: list[ContainerNeed] = []
    invalid = ""
    for i, c in enumerate(spec.get("containers") or []):
        try:
            a = podspec.container_ask(c, i)
        except ValueError as e:
            raise AskError(f"container {c.get('name') or i}: {e}") from None
        if a.cores > 0:
            containers.append(ContainerNeed(index=i, name=a.name or str(i), cores=a.cores,
                                            memory_units=a.memory_units))
        elif a.memory_units > 0 and not invalid:
            invalid = (f"container {a.name or i}: asks {podspec.RESOURCE_MEMORY} without {podspec.RESOURCE_CORE} "
                       "(memory alone cannot be allocated)")
    try:
        choices = pod_choices_of(pod)
    except ChoiceError as e:  # refused on every node, with the annotation and the fix named
        choices, invalid = NO_CHOICES, invalid or str(e)
    try:
        accepted, refused = podspec.model_filter(pod)
    except ValueError as e:  # a list too long to match cheaply: refused on every node, the annotation named
        accepted, refused, invalid = [], [], invalid or str(e)
    acc = tuple(sorted({m.lower() for m in accepted}))
    ref = tuple(sorted({m.lower() for m in refused}))
    # Everything that decides a verdict is in the key: the shape, the model lists, the parsed choices and, for a
    # pod whose annotations did not parse, the reason (its choices parse to none: without the reason it would
    # share the key, and the cached verdicts, of clean pods of its shape)
    key = (";".join(f"{c.cores}/{c.memory_units}" for c in containers) + "|" + ",".join(acc) + "|" + ",".join(ref)
           + "|" + choices_key(choices) + ("|!" + invalid if invalid else ""))
    return PodAsk(containers=tuple(containers), accepted=acc, refused=ref, invalid=invalid, key=key, choices=choices)


def choices_key(c: Choices) -> str:
    """The part of the cache key that the per-pod choices make (UUID entries never contain `*`, `,` or `|`)."""
    select = "*" if c.select is None else ",".join(sorted(c.select))
    return f"{c.policy}|{select}|{','.join(sorted(c.exclude))}"


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID, or namespace/name when the UID is missing."""
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}")


@dataclass(frozen=True)
class ContainerNeed:
    index: int  # position in spec.containers
    name: str
    cores: int  # vcuda-core: <100 a share of one card, n*100 n whole cards
    memory_units: int  # vcuda-memory units (the node's memory_unit_mib each)


@dataclass(frozen=True)
class PodAsk:
    containers: tuple[ContainerNeed, ...]  # GPU containers in spec order
    accepted: tuple[str, ...]  # lower-cased gpumgr.io/gpu-model entries; empty = any model
    refused: tuple[str, ...]  # lower-cased gpumgr.io/gpu-model-exclude entries
    invalid: str  # why no node can ever take the pod ("" when none of that)
    key: str  # the same for pods that ask the same: the cache key of fits
    choices: Choices = NO_CHOICES  # gpu-policy, gpu-uuid-select / -exclude (gpumgr/requests/choices.py)

    @property
    def wants_gpu(self) -> bool:
        return bool(self.containers) or bool(self.invalid)

    @property
    def whole_only(self) -> bool:
        return all(c.cores >= 100 for c in self.containers)

    def allows(self, model: str) -> bool:
        return podspec.model_matches(model, list(self.accepted), list(self.refused))
