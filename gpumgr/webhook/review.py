"""AdmissionReview v1 on the wire: the request the API server sends, the response it expects.

Anything the webhook cannot read raises `BadReview`, answered with HTTP 400 and a JSON body naming the problem.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from gpumgr.serving import jsonbound

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_UID = 128  # the API server sends a UUID


class BadReview(ValueError):
    """A body that is not an AdmissionReview v1 the webhook can answer."""


def decode(raw: bytes, max_elements: int) -> Any:
    """JSON of at most `jsonbound.API_OBJECT_DEPTH` levels of nesting and `max_elements` keys, values, objects and
    arrays, both checked on the bytes before anything is built (`gpumgr.serving.jsonbound`)."""
    try:
        doc = jsonbound.loads(raw, max_elements=max_elements, max_depth=jsonbound.API_OBJECT_DEPTH)
    except jsonbound.JsonBoundsError as e:
        raise BadReview(str(e)) from None
    # the scan's count is of brackets; kept as a second check of the document
    if _depth_exceeds(doc, jsonbound.API_OBJECT_DEPTH):
        raise BadReview(f"the body is nested deeper than {jsonbound.API_OBJECT_DEPTH} levels")
    return doc


def parse_review(doc: Any) -> ReviewRequest:
    if not isinstance(doc, dict):
        raise BadReview(f"the body must be an AdmissionReview object, got {_kind(doc)}")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise BadReview(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got apiVersion {doc.get('apiVersion')!r} and kind "
            f"{doc.get('kind')!r} (set admissionReviewVersions: [\"v1\"] in the webhook configuration)"
        )
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadReview(f"request must be an object, got {_kind(req)}")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID:
        raise BadReview(f"request.uid must be a non-empty string of at most {MAX_UID} characters")
    kind = req.get("kind")
    if not isinstance(kind, dict):
        raise BadReview(f"request.kind must be an object (group, version, kind), got {_kind(kind)}")
    operation = req.get("operation")
    if not isinstance(operation, str):
        raise BadReview(f"request.operation must be a string, got {_kind(operation)}")
    obj = req.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise BadReview(f"request.object must be an object, got {_kind(obj)}")
    old = req.get("oldObject")
    if old is not None and not isinstance(old, dict):
        raise BadReview(f"request.oldObject must be an object, got {_kind(old)}")
    is_pod = kind.get("group", "") == "" and kind.get("kind") == "Pod" and req.get("subResource") in (None, "")
    namespace = req.get("namespace")
    return ReviewRequest(uid=uid, operation=operation, is_pod=is_pod, obj=obj,
                         namespace=namespace[:253] if isinstance(namespace, str) else "", old=old)


def response(uid: str, *, patch: list[dict[str, Any]] | None = None, denied: str = "", code: int = 403,
             warnings: list[str] | None = None) -> dict[str, Any]:
    """An AdmissionReview v1 answer: allowed with an optional JSONPatch, or refused with `denied` as the message."""
    body: dict[str, Any] = {"uid": uid, "allowed": not denied}
    if denied:
        body["status"] = {"code": code, "message": denied}
    elif patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        body["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": KIND, "response": body}


def _depth_exceeds(doc: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


@dataclass(frozen=True)
class ReviewRequest:
    uid: str
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    is_pod: bool  # core/v1 Pod itself (not a subresource such as pods/status)
    obj: dict[str, Any] | None  # the object as it will be stored (null for DELETE)
    namespace: str = ""  # request.namespace (a new pod's metadata may not carry it yet)
    old: dict[str, Any] | None = None  # request.oldObject: the stored object, for UPDATE
