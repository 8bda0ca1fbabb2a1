"""What a pod asks for and what is recorded on it: resource names, annotation keys, and readers for pod JSON.

Pods are handled as API JSON (camelCase dicts), the form the scheduler sends to the extender and the form
`ApiClient.sanitize_for_serialization` gives for client objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

RESOURCE_CORE = "tencent.com/vcuda-core"
RESOURCE_MEMORY = "tencent.com/vcuda-memory"

ANN_CORE_LIMIT = "tencent.com/vcuda-core-limit"  # soft-limit ceiling (percent), set by users
ANN_PREDICATE_IDX = "tencent.com/predicate-gpu-idx-"  # + container index; value: comma-joined card minors
ANN_PREDICATE_NODE = "tencent.com/predicate-node"
ANN_PREDICATE_TIME = "tencent.com/predicate-time"  # UnixNano of the extender's decision
ANN_ASSIGNED = "tencent.com/gpu-assigned"  # "false" after bind, "true" once the agent verified the pod

ANN_GPU_MODEL = "gpumgr.io/gpu-model"  # pod: comma list of accepted models
ANN_GPU_MODEL_EXCLUDE = "gpumgr.io/gpu-model-exclude"  # pod: comma list of refused models
ANN_NODE_INVENTORY = "gpumgr.io/gpu-inventory"  # node: JSON published by the agent (see docs/annotations.md)


# ASCII digits only: Kubernetes quantities are ASCII, and Python's int() and \d would take "٣٠" or "３０" as 30
_QUANTITY = re.compile(r"^([+]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?\Z")
_SUFFIX: dict[str, int | Fraction] = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


MAX_QUANTITY = 2**63 - 1
MAX_MODEL_ENTRIES = 32  # models in gpumgr.io/gpu-model or gpu-model-exclude
MAX_MODEL_CHARS = 128  # one model name (NVIDIA's longest are under 40)


def quantity(value: Any) -> int:
    """Extended resources are whole numbers. Accept ints and Kubernetes quantity strings ("30", "1k" as
    kube-scheduler canonicalises 1000, "2e3", "1000m"), refusing anything that is not a whole number."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= MAX_QUANTITY:
            raise ValueError(f"quantity out of range: {value!r}")
        return value
    text = str(value)
    m = _QUANTITY.match(text.strip()) if len(text) <= 64 else None
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    if len(m.group(2)) > 30:
        raise ValueError(f"quantity out of range: {value!r}")
    number = Fraction(m.group(2))
    if m.group(3):
        exponent = int(m.group(3)[1:])
        if abs(exponent) > 30:  # never do huge big-number arithmetic for hostile input
            raise ValueError(f"quantity out of range: {value!r}")
        number *= Fraction(10) ** exponent
    else:
        number *= _SUFFIX[m.group(4) or ""]
    if number.denominator != 1:
        raise ValueError(f"not a whole-number quantity: {value!r}")
    if number > MAX_QUANTITY:
        raise ValueError(f"quantity out of range: {value!r}")
    return int(number)


def container_ask(container: Mapping[str, Any], index: int, init: bool = False) -> ContainerAsk:
    res = container.get("resources") or {}
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}

    def get(name: str) -> int:
        return quantity(limits.get(name, requests.get(name)))

    return ContainerAsk(index=index, name=str(container.get("name", "")), cores=get(RESOURCE_CORE),
                        memory_units=get(RESOURCE_MEMORY), init=init)


def gpu_containers(pod: Mapping[str, Any], include_init: bool = False) -> list[ContainerAsk]:
    """The pod's containers that ask for vcuda-core, in spec order (index = position in spec.containers)."""
    spec = pod.get("spec") or {}
    out = []
    if include_init:
        for i, c in enumerate(spec.get("initContainers") or []):
            ask = container_ask(c, i, init=True)
            if ask.cores > 0:
                out.append(ask)
    for i, c in enumerate(spec.get("containers") or []):
        ask = container_ask(c, i)
        if ask.cores > 0:
            out.append(ask)
    return out


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    return bool(gpu_containers(pod, include_init=True))


def ascii_uint(text: str, max_digits: int) -> int | None:
    """`text` as a whole number >= 0 when it is 1..max_digits ASCII digits, else None. The one rule for numbers
    read from annotations, files and the environment: int() and str.isdigit() would also take "٣٠" or "３０"."""
    if not (0 < len(text) <= max_digits and text.isascii() and text.isdigit()):
        return None
    return int(text)


def pod_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's annotations as strings; a malformed metadata or annotations field reads as none."""
    meta = pod.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(ann, Mapping):
        return {}
    return {str(k): str(v) for k, v in ann.items()}


def predicate_minors(pod: Mapping[str, Any], container_index: int) -> list[int] | None:
    """Card minors the extender recorded for a container, or None."""
    raw = pod_annotations(pod).get(f"{ANN_PREDICATE_IDX}{container_index}")
    if raw is None or raw.strip() == "":
        return None
    parts = [x.strip() for x in raw.split(",") if x.strip() != ""]
    if len(parts) > 64:
        return None
    minors = [m for m in (ascii_uint(p, 6) for p in parts) if m is not None]
    return minors if len(minors) == len(parts) else None  # only ASCII card minors


def model_filter(pod: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(accepted models, refused models) from the pod's annotations; empty lists mean no constraint.

    Raises ValueError naming the annotation when a list is longer than MAX_MODEL_ENTRIES or an entry longer
    than MAX_MODEL_CHARS: each entry is matched against every card of every node, so an unbounded list in a
    256 KiB annotation would cost the extender billions of comparisons for one pod.
    """
    ann = pod_annotations(pod)

    def split(key: str) -> list[str]:
        text = ann.get(key, "")
        entries = [m.strip() for m in text.split(",") if m.strip()]
        if len(entries) > MAX_MODEL_ENTRIES:
            raise ValueError(f"annotation {key}: more than {MAX_MODEL_ENTRIES} models; name at most "
                             f"{MAX_MODEL_ENTRIES} (a part of the name such as A100 matches every A100 model)")
        long = next((m for m in entries if len(m) > MAX_MODEL_CHARS), None)
        if long is not None:
            raise ValueError(f"annotation {key}: model {long[:40]!r}... is longer than {MAX_MODEL_CHARS} "
                             "characters")
        return entries

    return split(ANN_GPU_MODEL), split(ANN_GPU_MODEL_EXCLUDE)


def model_matches(model: str, accepted: list[str], refused: list[str]) -> bool:
    """Case-insensitive substring match, so "A100" matches "NVIDIA A100-SXM4-40GB"."""
    m = model.lower()
    if refused and any(r.lower() in m for r in refused):
        return False
    return not accepted or any(a.lower() in m for a in accepted)


@dataclass(frozen=True)
class ContainerAsk:
    index: int  # position in spec.containers (or spec.initContainers when init)
    name: str
    cores: int  # vcuda-core
    memory_units: int  # vcuda-memory units
    init: bool = False
