"""AdmissionReview v1 bodies as the API server sends them for a pod CREATE."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

_uids = itertools.count(1)
CORE = "tencent.com/vcuda-core"
MEMORY = "tencent.com/vcuda-memory"


def container(name: str, limits: dict[str, Any] | None = None,
              requests: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "image": "cuda:12", "resources": res}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container("app")]}
    if init:
        spec["initContainers"] = list(init)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"}, "spec": spec}


def review(obj: dict[str, Any] | None, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    uid = f"705ab4f5-6393-11e8-b7cc-{next(_uids):012x}"
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "name": "p",
            "namespace": "team",
            "operation": operation,
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patch_of(resp: dict[str, Any]) -> list[dict[str, Any]]:
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert isinstance(ops, list)
    return ops


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSONPatch of add/replace on object members, applied as RFC 6902 says."""
    out = json.loads(json.dumps(doc))
    for op in ops:
        parts = op["path"].lstrip("/").split("/")
        target = out
        for p in parts[:-1]:
            target = target[p]
        if op["op"] == "replace":
            assert parts[-1] in target, f"replace of a missing member {op['path']}"
        assert op["op"] in ("add", "replace"), op
        target[parts[-1]] = op["value"]
    return out
