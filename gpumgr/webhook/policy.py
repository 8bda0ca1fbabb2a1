"""What the webhook does to one pod: refuse what no node could ever run, point GPU pods at the gpumgr scheduler.

The rules are the agent's and the extender's own: quantities are read by `gpumgr.requests.podspec`, and each GPU
container's ask is checked by `allocator.Request.validate` with no node limit, so only what is wrong on every node is
refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumgr.allocator.request import HUNDRED, InvalidRequest, Request
from gpumgr.requests import podspec
from gpumgr.requests.choices import (
    ANN_POLICY,
    ANN_UUID_EXCLUDE,
    ANN_UUID_SELECT,
    HAMI_NOUSE_UUID,
    HAMI_POLICY,
    HAMI_USE_UUID,
    ChoiceError,
    pod_choices_of,
)

DEFAULT_SCHEDULER = "default-scheduler"
MAX_CONTAINERS = 256  # containers plus init containers of one pod
MAX_CARDS = 16  # whole cards one container may ask (`--max-cards-per-container`): more than any node has
_UNLIMITED = podspec.MAX_QUANTITY
# The annotations an UPDATE may change that decide where a GPU pod goes (all read by the extender at every call)
CHOICE_ANNOTATIONS = (ANN_POLICY, ANN_UUID_SELECT, ANN_UUID_EXCLUDE, HAMI_POLICY, HAMI_USE_UUID, HAMI_NOUSE_UUID,
                      podspec.ANN_GPU_MODEL, podspec.ANN_GPU_MODEL_EXCLUDE)


def review_pod(pod: Mapping[str, Any], operation: str, scheduler_name: str, max_cards: int = MAX_CARDS,
               old: Mapping[str, Any] | None = None) -> Verdict:
    """CREATE is reviewed whole; a container asking more than `max_cards` whole cards is refused (no node has that
    many). On UPDATE (`old` is the stored pod) only the choice and model annotations can change what the scheduler
    does (resources and schedulerName are immutable): see `review_update`. Other operations pass."""
    if operation == "UPDATE":
        return review_update(pod, old)
    if operation != "CREATE":
        return Verdict()
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return Verdict(denied="the pod has no spec object")
    asks: list[podspec.ContainerAsk] = []
    total = 0
    for field_name, init in (("initContainers", True), ("containers", False)):
        containers = spec.get(field_name)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return Verdict(denied=f"spec.{field_name} must be an array")
        total += len(containers)
        if total > MAX_CONTAINERS:
            return Verdict(denied=f"the pod has more than {MAX_CONTAINERS} containers and init containers")
        for i, c in enumerate(containers):
            if not isinstance(c, dict):
                return Verdict(denied=f"spec.{field_name}[{i}] must be an object")
            problem = _quantity_problem(c, i, init)
            if problem:
                return Verdict(denied=problem)
            asks.append(podspec.container_ask(c, i, init=init))
    gpu = [a for a in asks if a.cores > 0 or a.memory_units > 0]
    if not gpu:
        return Verdict()
    for a in gpu:
        problem = _ask_problem(a, max_cards)
        if problem:
            return Verdict(denied=problem)
    problem = annotation_problem(pod)
    if problem:
        return Verdict(denied=problem)
    return _point_at(spec, scheduler_name)


def review_update(pod: Mapping[str, Any], old: Mapping[str, Any] | None) -> Verdict:
    """An update that writes a malformed choice or model annotation onto a GPU pod is refused, naming the
    annotation (docs/scheduling-choices.md: a malformed annotation is never ignored; a pod still pending would
    otherwise be placed by a stale verdict or refused with no one told why). An update that leaves these
    annotations as they were passes whatever they hold: a pod admitted before the webhook ran must still get
    its finalizers removed and its labels changed."""
    if old is not None and _choice_annotations(old) == _choice_annotations(pod):
        return Verdict()
    if not _asks_gpu(pod):
        return Verdict()
    problem = annotation_problem(pod)
    return Verdict(denied=f"{problem} (set by this update)") if problem else Verdict()


def annotation_problem(pod: Mapping[str, Any]) -> str:
    """Why the pod's choice or model annotations cannot be read, or ""."""
    try:
        pod_choices_of(pod)  # gpu-policy, gpu-uuid-select / -exclude: malformed is refused on every node
        podspec.model_filter(pod)  # gpu-model / gpu-model-exclude: too long a list is refused on every node
    except (ChoiceError, ValueError) as e:
        return str(e)
    return ""


def _choice_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    ann = podspec.pod_annotations(pod)
    return {k: ann[k] for k in CHOICE_ANNOTATIONS if k in ann}


def _asks_gpu(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return False
    for field_name in ("initContainers", "containers"):
        containers = spec.get(field_name)
        if not isinstance(containers, list):
            continue
        for c in containers[:MAX_CONTAINERS]:
            res = c.get("resources") if isinstance(c, dict) else None
            for part in ("limits", "requests"):
                values = res.get(part) if isinstance(res, dict) else None
                if isinstance(values, dict) and (podspec.RESOURCE_CORE in values or podspec.RESOURCE_MEMORY in values):
                    return True
    return False


def _point_at(spec: Mapping[str, Any], scheduler_name: str) -> Verdict:
    current = spec.get("schedulerName")
    if current == scheduler_name:
        return Verdict()
    if current in (None, "", DEFAULT_SCHEDULER):
        op = "replace" if "schedulerName" in spec else "add"
        return Verdict(patch=[{"op": op, "path": "/spec/schedulerName", "value": scheduler_name}])
    return Verdict(warnings=[
        f"this GPU pod names schedulerName {str(current)[:253]!r}, left as it is: place it with gpumgr by using "
        f"{scheduler_name!r}, or configure the gpumgr extender on that scheduler"
    ])


def _quantity_problem(container: Mapping[str, Any], index: int, init: bool) -> str:
    """Why a vcuda quantity of the container cannot be read, or ""."""
    res = container.get("resources")
    res = {} if res is None else res
    if not isinstance(res, dict):
        return f"{_where(container, index, init)}: resources must be an object"
    for part in ("limits", "requests"):
        values = res.get(part)
        values = {} if values is None else values
        if not isinstance(values, dict):
            return f"{_where(container, index, init)}: resources.{part} must be an object"
        for name in (podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY):
            try:
                podspec.quantity(values.get(name))
            except ValueError as e:
                return (f"{_where(container, index, init)}: resources.{part}[{name}]: {e}; vcuda resources are "
                        "whole numbers such as \"50\" or \"200\"")
    return ""


def _ask_problem(a: podspec.ContainerAsk, max_cards: int) -> str:
    where = _where_ask(a)
    if a.cores == 0:
        return (f"{where} asks {podspec.RESOURCE_MEMORY} without {podspec.RESOURCE_CORE}: memory alone cannot be "
                f"allocated. Add {podspec.RESOURCE_CORE} (1-99 for a share of one card, 100 per whole card) or "
                f"remove {podspec.RESOURCE_MEMORY}")
    try:
        Request(cores=a.cores, memory_mib=a.memory_units).validate(card_count=_UNLIMITED, largest_card_mib=_UNLIMITED)
    except InvalidRequest as e:
        return f"{where}: {e}. {_fix(a)}"
    cards = a.cores // HUNDRED
    if cards > max_cards:
        return (f"{where} asks {cards} whole cards ({podspec.RESOURCE_CORE}: {a.cores}), but this cluster allows "
                f"at most {max_cards} whole cards per container (the webhook's --max-cards-per-container, chart "
                f"value webhook.maxCardsPerContainer). Ask {podspec.RESOURCE_CORE}: {max_cards * HUNDRED} or less")
    return ""


def _fix(a: podspec.ContainerAsk) -> str:
    if a.cores > HUNDRED and a.cores % HUNDRED:
        low = a.cores // HUNDRED * HUNDRED
        return (f"Ask {podspec.RESOURCE_CORE}: {low} or {low + HUNDRED} for whole cards, or below 100 for a share "
                "of one card")
    if a.cores < HUNDRED and a.memory_units == 0:
        return (f"Add {podspec.RESOURCE_MEMORY} (units of the node's memory unit, 256 MiB by default; 4 = 1 GiB), "
                f"or ask {podspec.RESOURCE_CORE}: 100 for a whole card")
    return "Fix the container's vcuda resources"


def _where(container: Mapping[str, Any], index: int, init: bool) -> str:
    name = container.get("name")
    label = name[:63] if isinstance(name, str) and name else str(index)
    return f"{'init container' if init else 'container'} {label!r}"


def _where_ask(a: podspec.ContainerAsk) -> str:
    return f"{'init container' if a.init else 'container'} {(a.name[:63] or str(a.index))!r}"


@dataclass(frozen=True)
class Verdict:
    denied: str = ""  # non-empty: refuse the pod with this message
    patch: list[dict[str, Any]] = field(default_factory=list)  # JSONPatch operations when allowed
    warnings: list[str] = field(default_factory=list)
