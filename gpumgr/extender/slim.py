"""The parts of a pod the extender keeps in its cluster view: what `ask`, `claims` and `binder` read, nothing
else. A watched pod carries much more (managed fields, env, volumes, other annotations); keeping only this
bounds the view's memory by the number of GPU pods, not by what their authors put in them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumgr.requests import podspec
from gpumgr.requests.mig_ask import is_mig_resource

KEPT_ANNOTATIONS = ("tencent.com/", "gpumgr.io/")  # predicate-*, gpu-assigned, vcuda-core-limit, gpu-model*
KEPT_RESOURCES = (podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY)


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `pod` with only the fields the extender reads (same shape as the API's JSON)."""
    meta = _dict(pod.get("metadata"))
    out_meta: dict[str, Any] = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                     "deletionTimestamp") if k in meta}
    ann = _dict(meta.get("annotations"))
    out_meta["annotations"] = {k: v for k, v in ann.items() if isinstance(k, str) and k.startswith(KEPT_ANNOTATIONS)}
    spec = _dict(pod.get("spec"))
    out_spec: dict[str, Any] = {k: spec[k] for k in ("nodeName", "schedulerName") if k in spec}
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if isinstance(containers, list):
            out_spec[field] = [_container(c) for c in containers]
    out: dict[str, Any] = {"metadata": out_meta, "spec": out_spec}
    phase = _dict(pod.get("status")).get("phase")
    if phase is not None:
        out["status"] = {"phase": phase}
    return out


def _container(c: Any) -> Any:
    if not isinstance(c, dict):
        return c  # unreadable: podspec reports it as before
    res = _dict(c.get("resources"))
    kept: dict[str, Any] = {}
    for part in ("limits", "requests"):
        values = res.get(part)
        if isinstance(values, dict):
            kept[part] = {k: v for k, v in values.items() if k in KEPT_RESOURCES or is_mig_resource(k)}
    out: dict[str, Any] = {"resources": kept}
    if "name" in c:
        out["name"] = c["name"]
    return out


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}
