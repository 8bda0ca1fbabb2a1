"""List responses: `limit` / `continue` paging and the `<Kind>List` body."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from gpumgr.sim.kubeapi.errors import bad_request
from gpumgr.sim.kubeapi.objects import ResourceKind


def list_body(kind: ResourceKind, items: list[dict[str, Any]], resource_version: int, limit: int,
              continue_token: str | None) -> dict[str, Any]:
    """One page of `items` (sorted by namespace and name) as a `<Kind>List`.

    A continue token names the last key served; the next page starts after it in the current state (the
    real server serves the snapshot of the first page instead; our clients do not depend on that).
    """
    if continue_token:
        after = _decode_token(continue_token)
        items = [obj for obj in items if _sort_key(obj) > after]
    metadata: dict[str, Any] = {"resourceVersion": str(resource_version)}
    if limit and len(items) > limit:
        remaining = len(items) - limit
        items = items[:limit]
        metadata["continue"] = _encode_token(_sort_key(items[-1]), resource_version)
        metadata["remainingItemCount"] = remaining
    return {"kind": kind.list_kind, "apiVersion": kind.api_version, "metadata": metadata, "items": items}


def _sort_key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def _encode_token(key: tuple[str, str], resource_version: int) -> str:
    raw = json.dumps({"rv": resource_version, "after": list(key)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_token(token: str) -> tuple[str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        namespace, name = data["after"]
        if not isinstance(namespace, str) or not isinstance(name, str):
            raise TypeError
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise bad_request(f"invalid continue token {token!r}") from None
    return namespace, name
