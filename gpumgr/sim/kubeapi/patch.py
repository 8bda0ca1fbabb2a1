"""The three PATCH flavours the API server accepts for built-in objects, as pure functions on JSON values.

- JSON merge patch (RFC 7386): maps merge, `null` deletes, anything else replaces.
- Strategic merge patch: like merge patch, but lists that Kubernetes declares mergeable are merged by
  their key (containers by `name`, conditions by `type`, ...), `$patch: delete|replace` directives and
  `$deleteFromPrimitiveList/<field>` are honoured, `$setElementOrder/<field>` is accepted and ignored.
- JSON patch (RFC 6902) subset: `add`, `replace`, `remove`, `test`.

Errors are raised as `PatchError` (malformed patch document) or `PatchFailed` (well formed, but it does not
apply to this object); the HTTP layer turns them into 400 and 422.
"""

from __future__ import annotations

import copy
from typing import Any

# Lists merged by key under strategic merge patch (field name -> merge key), from the Kubernetes API types.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "taints": "key",
    "ownerReferences": "uid",
    "hostAliases": "ip",
}
# Lists of scalars merged as sets under strategic merge patch.
_PRIMITIVE_MERGE = {"finalizers"}

_DELETE_FROM = "$deleteFromPrimitiveList/"
_ORDER = "$setElementOrder/"


class PatchError(ValueError):
    """The patch document itself is malformed (HTTP 400)."""


class PatchFailed(ValueError):
    """The patch is well formed but cannot be applied to this object (HTTP 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch. Returns a new value; inputs are not modified."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for the list kinds in `_MERGE_KEYS`; otherwise the same as merge patch."""
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive is not None:
        raise PatchError(f"unknown $patch directive {directive!r} in a map")
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if key.startswith(_ORDER) or key == "$retainKeys":
            continue
        if key.startswith(_DELETE_FROM):
            field = key[len(_DELETE_FROM):]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            current = result.get(field)
            if isinstance(current, list):
                result[field] = [item for item in current if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _smp_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _smp_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if field in _PRIMITIVE_MERGE and isinstance(current, list):
        merged = list(current)
        merged.extend(item for item in patch if item not in merged)
        return copy.deepcopy(merged)
    merge_key = _MERGE_KEYS.get(field)
    if merge_key is None or not all(isinstance(item, dict) for item in patch):
        return copy.deepcopy(patch)
    if any(item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if i.get("$patch") != "replace"]
    result: list[Any] = copy.deepcopy(current) if isinstance(current, list) else []
    for item in patch:
        if merge_key not in item:
            raise PatchError(f"map in list {field!r} has no merge key {merge_key!r}")
        key = item[merge_key]
        index = next((i for i, old in enumerate(result)
                      if isinstance(old, dict) and old.get(merge_key) == key), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if v is not None})
        else:
            result[index] = _smp_map(result[index], item)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch with add, replace, remove and test. Returns a new value."""
    if not isinstance(operations, list):
        raise PatchError("json patch must be a JSON array of operations")
    doc = copy.deepcopy(target)
    for n, op in enumerate(operations):
        if not (isinstance(op, dict) and isinstance(op.get("op"), str) and isinstance(op.get("path"), str)):
            raise PatchError(f"json patch operation {n} must be an object with string 'op' and 'path'")
        kind = op["op"]
        if kind not in ("add", "replace", "remove", "test"):
            raise PatchError(f"json patch operation {n}: unsupported op {kind!r} "
                             "(supported: add, replace, remove, test)")
        if kind != "remove" and "value" not in op:
            raise PatchError(f"json patch operation {n} ({kind}) has no 'value'")
        tokens = _pointer(op["path"], n)
        doc = _apply_op(doc, kind, tokens, op.get("value"), op["path"])
    return doc


def _pointer(path: str, n: int) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"json patch operation {n}: path {path!r} must start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _apply_op(doc: Any, kind: str, tokens: list[str], value: Any, path: str) -> Any:
    if not tokens:
        if kind == "test":
            if doc != value:
                raise PatchFailed(f"testing value {path!r} failed")
            return doc
        if kind == "remove":
            raise PatchFailed("cannot remove the whole document")
        return copy.deepcopy(value)
    parent = doc
    for token in tokens[:-1]:
        parent = _child(parent, token, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if kind == "add":
            parent[last] = copy.deepcopy(value)
        elif last not in parent:
            raise PatchFailed(f"{kind} operation does not apply: doc is missing path: {path!r}")
        elif kind == "replace":
            parent[last] = copy.deepcopy(value)
        elif kind == "remove":
            del parent[last]
        elif parent[last] != value:
            raise PatchFailed(f"testing value {path!r} failed")
        return doc
    if isinstance(parent, list):
        if kind == "add" and last == "-":
            parent.append(copy.deepcopy(value))
            return doc
        index = _index(last, path)
        limit = len(parent) + (1 if kind == "add" else 0)
        if index >= limit:
            raise PatchFailed(f"{kind} operation does not apply: index out of range in {path!r}")
        if kind == "add":
            parent.insert(index, copy.deepcopy(value))
        elif kind == "replace":
            parent[index] = copy.deepcopy(value)
        elif kind == "remove":
            del parent[index]
        elif parent[index] != value:
            raise PatchFailed(f"testing value {path!r} failed")
        return doc
    raise PatchFailed(f"{kind} operation does not apply: {path!r} has no container")


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchFailed(f"doc is missing path: {path!r}")
        return node[token]
    if isinstance(node, list):
        index = _index(token, path)
        if index >= len(node):
            raise PatchFailed(f"index out of range in {path!r}")
        return node[index]
    raise PatchFailed(f"doc is missing path: {path!r}")


def _index(token: str, path: str) -> int:
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchFailed(f"invalid array index {token!r} in {path!r}")
    return int(token)
