"""MIG instances a pod asks through the device plugins: resources named `<prefix><profile>`, such as
`nvidia.com/mig-1g.10gb` (NVIDIA's `mixed` strategy names; the agent's `--mig-resource-prefix` changes the prefix).

Which prefix a node serves is in its inventory annotation, so a pod's asks are read by the `mig-<profile>` shape of
the name alone and matched against each node's prefix there. A pod needs the sum over its containers, or its
largest init container when that is more (init containers run one at a time, before the others)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpumgr.requests.podspec import quantity

_RESOURCE = re.compile(r"(?:[a-z0-9.-]{1,253}/)?mig-([0-9]{1,2}g\.[0-9]{1,4}gb(?:\+me)?)\Z")
MAX_CONTAINERS = 1000


def mig_asks(pod: Mapping[str, Any]) -> dict[str, int]:
    """{resource name: instances} the pod asks (empty for a pod that asks none). ValueError for a quantity that is
    not a whole number, or more than MAX_CONTAINERS containers (or init containers)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return {}
    total: dict[str, int] = {}
    init: dict[str, int] = {}
    for field, into, add in (("containers", total, True), ("initContainers", init, False)):
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        if len(containers) > MAX_CONTAINERS:  # refused, not cut: the asks of the rest would go uncounted
            raise ValueError(f"spec.{field} has {len(containers)} entries, more than {MAX_CONTAINERS}")
        for c in containers:
            for name, n in _container(c).items():
                into[name] = into.get(name, 0) + n if add else max(into.get(name, 0), n)
    for name, n in init.items():
        total[name] = max(total.get(name, 0), n)
    return {k: v for k, v in total.items() if v > 0}


def is_mig_resource(name: object) -> bool:
    return isinstance(name, str) and _RESOURCE.match(name) is not None


def profile_of(resource: str, prefix: str) -> str | None:
    """`nvidia.com/mig-1g.10gb` with prefix `nvidia.com/mig-` -> `1g.10gb`; None when the prefix differs."""
    return resource[len(prefix):] if resource.startswith(prefix) and _RESOURCE.match(resource) else None


def _container(c: Any) -> dict[str, int]:
    res = c.get("resources") if isinstance(c, Mapping) else None
    if not isinstance(res, Mapping):
        return {}
    limits = res.get("limits")
    requests = res.get("requests")
    limits = limits if isinstance(limits, Mapping) else {}
    requests = requests if isinstance(requests, Mapping) else {}
    out = {}
    for name in {*limits, *requests}:
        if isinstance(name, str) and _RESOURCE.match(name):
            try:
                out[name] = quantity(limits.get(name, requests.get(name)))
            except ValueError as e:
                where = f"container {c.get('name')}: " if isinstance(c.get("name"), str) else ""
                raise ValueError(f"{where}{name}: {e}") from None
    return out
