"""The `resource.k8s.io/v1` calls the DRA front end makes, as coroutines returning API JSON dicts.

The `kubernetes` client blocks, so calls run in threads; answers are read as raw JSON (no model objects: faster,
and nothing is dropped that the installed client's models do not know).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

Obj = dict[str, Any]
TIMEOUT = (5, 30)
MAX_EVENT_BYTES = 4 << 20


class DraKube:
    def __init__(self, api_client: Any):
        from kubernetes import client

        self.api = client.ResourceV1Api(api_client)

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", TIMEOUT)
        kwargs["_preload_content"] = False
        loop = asyncio.get_running_loop()
        resp = await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))
        return json.loads(resp.data) if resp.data else {}

    async def get_claim(self, namespace: str, name: str) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj: Obj = await self._run(self.api.read_namespaced_resource_claim, name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return obj

    async def list_claims(self) -> list[Obj]:
        doc = await self._run(self.api.list_resource_claim_for_all_namespaces)
        return list(doc.get("items") or [])

    def list_claims_sync(self) -> tuple[list[Obj], str]:
        resp: Any = self.api.list_resource_claim_for_all_namespaces(_preload_content=False, _request_timeout=TIMEOUT)
        doc = json.loads(resp.data)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def watch_claims_sync(self, resource_version: str, timeout_s: int) -> Iterator[Obj]:
        """Blocking: the watch events after `resource_version`, each a `{type, object}` dict, until the server
        ends the watch (at most `timeout_s`). Lines over MAX_EVENT_BYTES end it early."""
        resp: Any = self.api.list_resource_claim_for_all_namespaces(
            watch=True, resource_version=resource_version, timeout_seconds=timeout_s, allow_watch_bookmarks=True,
            _preload_content=False, _request_timeout=(5, timeout_s + 30))
        buf = b""
        try:
            for chunk in resp.stream(amt=None, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
                if len(buf) > MAX_EVENT_BYTES:
                    return
        finally:
            resp.release_conn()

    async def list_slices(self, driver: str, node: str) -> list[Obj]:
        doc = await self._run(self.api.list_resource_slice,
                              field_selector=f"spec.driver={driver},spec.nodeName={node}")
        return list(doc.get("items") or [])

    async def create_slice(self, body: Obj) -> Obj:
        created: Obj = await self._run(self.api.create_resource_slice, body)
        return created

    async def replace_slice(self, name: str, body: Obj) -> Obj:
        replaced: Obj = await self._run(self.api.replace_resource_slice, name, body)
        return replaced

    async def delete_slice(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self._run(self.api.delete_resource_slice, name)
        except ApiException as e:
            if e.status != 404:
                raise
