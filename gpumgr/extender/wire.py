"""The scheduler-extender JSON (`k8s.io/kube-scheduler/extender/v1`): request parsing and reply shapes.

The Go structs have no json tags, so the keys are the Go field names: `Pod`, `Nodes`, `NodeNames`,
`FailedNodes`, `FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`, `PodName`, `PodNamespace`, `PodUID`,
`Node`. Go's decoder matches keys case-insensitively; we accept the exact names only and reply with them.

Anything malformed raises `BadRequest`, whose message names the offending key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpumgr.serving import jsonbound

MAX_NODES = 20_000  # NodeNames / Nodes.items per call (Kubernetes supports 5,000 nodes per cluster)
MAX_NAME = 253  # DNS subdomain: the longest node, pod or namespace name
MAX_CONTAINERS = 256  # per containers / initContainers list (real pods have a handful; the API caps pods at ~1.5 MB)
_PLAIN = re.compile(r"[A-Za-z0-9._\-]*")  # characters JSON strings carry unescaped


class BadRequest(ValueError):
    """A request body the extender cannot use; answered with HTTP 400 and this message."""


def decode_json(raw: bytes, max_elements: int, max_depth: int = jsonbound.API_OBJECT_DEPTH) -> Any:
    """The body as JSON, refused before decoding when it may hold more than `max_elements` keys, values, objects
    and arrays or nests deeper than `max_depth` (`gpumgr.serving.jsonbound`): what decoding can allocate is bounded."""
    try:
        return jsonbound.loads(raw, max_elements=max_elements, max_depth=max_depth)
    except jsonbound.JsonBoundsError as e:
        raise BadRequest(str(e)) from None


def parse_extender_args(doc: Any) -> ExtenderArgs:
    """The body of filter and prioritize: `Pod` plus either `NodeNames` or `Nodes` (the other null)."""
    if not isinstance(doc, dict):
        raise BadRequest(f"the body must be a JSON object (ExtenderArgs), got {_kind(doc)}")
    pod = doc.get("Pod")
    if pod is None:
        raise BadRequest("missing key Pod (ExtenderArgs needs Pod and one of NodeNames or Nodes)")
    check_pod(pod)
    names, nodes = doc.get("NodeNames"), doc.get("Nodes")
    if names is not None and nodes is not None:
        raise BadRequest("give one of NodeNames (nodeCacheCapable: true) or Nodes, not both")
    if names is None and nodes is None:
        raise BadRequest("missing key NodeNames (nodeCacheCapable: true) or Nodes (nodeCacheCapable: false)")
    if names is not None:
        return ExtenderArgs(pod=pod, node_names=_names(names), node_items=None)
    if not isinstance(nodes, dict):
        raise BadRequest(f"Nodes must be a NodeList object, got {_kind(nodes)}")
    items = nodes.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadRequest(f"Nodes.items must be an array, got {_kind(items)}")
    if len(items) > MAX_NODES:
        raise BadRequest(f"Nodes.items has {len(items)} entries; at most {MAX_NODES} are accepted")
    names_out = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise BadRequest(f"Nodes.items[{i}].metadata.name must be a node name (a non-empty string)")
        names_out.append(name)
    return ExtenderArgs(pod=pod, node_names=names_out, node_items=items)


def parse_binding_args(doc: Any) -> BindingArgs:
    if not isinstance(doc, dict):
        raise BadRequest(f"the body must be a JSON object (ExtenderBindingArgs), got {_kind(doc)}")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        if key not in doc:
            raise BadRequest(f"missing key {key} (ExtenderBindingArgs needs PodName, PodNamespace, PodUID, Node)")
        v = doc[key]
        if not isinstance(v, str) or len(v) > MAX_NAME:
            raise BadRequest(f"{key} must be a string of at most {MAX_NAME} characters, got {_kind(v)}")
        if key != "PodUID" and not v:
            raise BadRequest(f"{key} must not be empty")
        values[key] = v
    return BindingArgs(name=values["PodName"], namespace=values["PodNamespace"], uid=values["PodUID"],
                       node=values["Node"])


def check_pod(pod: Any) -> None:
    """The parts of a v1.Pod the extender reads must have the API's types."""
    if not isinstance(pod, dict):
        raise BadRequest(f"Pod must be a v1.Pod object, got {_kind(pod)}")
    meta = pod.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            raise BadRequest(f"Pod.metadata must be an object, got {_kind(meta)}")
        for key in ("name", "namespace", "uid", "resourceVersion"):
            if meta.get(key) is not None and not isinstance(meta[key], str):
                raise BadRequest(f"Pod.metadata.{key} must be a string, got {_kind(meta[key])}")
        ann = meta.get("annotations")
        if ann is not None and (not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values())):
            raise BadRequest("Pod.metadata.annotations must be an object of strings")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise BadRequest(f"Pod.spec must be an object, got {_kind(spec)}")
    if spec.get("nodeName") is not None and not isinstance(spec["nodeName"], str):
        raise BadRequest("Pod.spec.nodeName must be a string")
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise BadRequest(f"Pod.spec.{field} must be an array, got {_kind(containers)}")
        if len(containers) > MAX_CONTAINERS:
            raise BadRequest(f"Pod.spec.{field} has {len(containers)} entries; at most {MAX_CONTAINERS} are accepted")
        for i, c in enumerate(containers):
            where = f"Pod.spec.{field}[{i}]"
            if not isinstance(c, dict):
                raise BadRequest(f"{where} must be an object, got {_kind(c)}")
            if c.get("name") is not None and not isinstance(c["name"], str):
                raise BadRequest(f"{where}.name must be a string")
            res = c.get("resources")
            if res is None:
                continue
            if not isinstance(res, dict):
                raise BadRequest(f"{where}.resources must be an object, got {_kind(res)}")
            for part in ("limits", "requests"):
                if res.get(part) is not None and not isinstance(res[part], dict):
                    raise BadRequest(f"{where}.resources.{part} must be an object, got {_kind(res[part])}")


def filter_reply(args: ExtenderArgs, passed: list[str], failed: dict[str, str],
                 unresolvable: dict[str, str]) -> dict[str, Any]:
    """ExtenderFilterResult in the form the scheduler sent: NodeNames, or Nodes with the passing items."""
    out: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    if args.node_items is None:
        out["NodeNames"], out["Nodes"] = passed, None
    else:
        keep = set(passed)
        items = [item for item, name in zip(args.node_items, args.node_names, strict=True) if name in keep]
        out["Nodes"], out["NodeNames"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}, None
    return out


def priority_reply(names: list[str], scores: list[int]) -> bytes:
    """HostPriorityList, encoded: thousands of hosts are common, so names that need no JSON escaping (all
    valid node names) are written directly."""
    if _PLAIN.fullmatch("".join(names)):
        ends = _SCORE_ENDS
        items = [f'{{"Host":"{n}{ends[s]}' if type(s) is int and 0 <= s < len(ends)
                 else f'{{"Host":"{n}","Score":{int(s)}}}' for n, s in zip(names, scores, strict=True)]
        return ("[" + ",".join(items) + "]").encode()
    return json.dumps([{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]).encode()


_SCORE_ENDS = [f'","Score":{s}}}' for s in range(11)]  # the end of a HostPriority item, per score 0..10


def binding_reply(error: str = "") -> dict[str, str]:
    """ExtenderBindingResult: an empty Error means bound."""
    return {"Error": error}


def _names(names: Any) -> list[str]:
    if not isinstance(names, list):
        raise BadRequest(f"NodeNames must be an array of node names, got {_kind(names)}")
    if len(names) > MAX_NODES:
        raise BadRequest(f"NodeNames has {len(names)} entries; at most {MAX_NODES} are accepted")
    if not names or (set(map(type, names)) == {str} and min(map(len, names)) > 0
                     and max(map(len, names)) <= MAX_NAME):
        return names  # all good, found at C speed (thousands of names per call)
    for i, n in enumerate(names):
        if not isinstance(n, str) or not n or len(n) > MAX_NAME:
            raise BadRequest(f"NodeNames[{i}] must be a node name (a non-empty string), got {_kind(n)}")
    return names


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str]
    node_items: list[Any] | None  # the Node objects when the scheduler sent Nodes (nodeCacheCapable: false)


@dataclass(frozen=True)
class BindingArgs:
    name: str
    namespace: str
    uid: str
    node: str
