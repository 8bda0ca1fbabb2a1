"""The `resource.k8s.io/v1` calls the DRA front end makes, as coroutines returning API JSON dicts.

The `kubernetes` client blocks, so calls run in threads; answers are read as raw JSON (no model objects: faster,
and nothing is dropped that the installed client's models do not know).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from gpumgr.kube.pace import MAX_PAGE_BYTES, MAX_PAGE_ELEMENTS, read_capped
from gpumgr.serving import jsonbound

Obj = dict[str, Any]
TIMEOUT = (5, 30)
LIST_PAGE = 500
MAX_CLAIMS = 100_000  # recovery lists every claim; a cluster beyond this is refused, not read into memory


class DraKube:
    def __init__(self, api_client: Any):
        from kubernetes import client

        self.api = client.ResourceV1Api(api_client)
        self.core = client.CoreV1Api(api_client)

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", TIMEOUT)
        kwargs["_preload_content"] = False
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs)
        # read in the thread too, within MAX_PAGE_BYTES and MAX_PAGE_ELEMENTS: a broken API server's answer is
        # refused (ListTooLarge, a ValueError naming the bound), never read whole (gpumgr.kube.pace)
        raw = await loop.run_in_executor(None, lambda: read_capped(call(), MAX_PAGE_BYTES, fn.__name__))
        return jsonbound.loads(raw, max_elements=MAX_PAGE_ELEMENTS, max_depth=64, what=fn.__name__) if raw else {}

    async def get_claim(self, namespace: str, name: str) -> Obj | None:
        return await self._get(self.api.read_namespaced_resource_claim, name, namespace)

    async def get_pod(self, namespace: str, name: str) -> Obj | None:
        """One pod, read live (a claim's consumer the agent's pod cache does not hold yet); None when not found."""
        return await self._get(self.core.read_namespaced_pod, name, namespace)

    async def _get(self, fn: Callable[..., Any], name: str, namespace: str) -> Obj | None:
        """One object; None when the API server says it does not exist (404)."""
        from kubernetes.client.exceptions import ApiException

        try:
            obj: Obj = await self._run(fn, name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return obj

    async def list_claims(self) -> list[Obj]:
        """Every ResourceClaim in the cluster (recovery only), in pages of LIST_PAGE; refuses more than MAX_CLAIMS."""
        items: list[Obj] = []
        token = ""
        while True:
            kw: dict[str, Any] = {"limit": LIST_PAGE}
            if token:
                kw["_continue"] = token
            doc = await self._run(self.api.list_resource_claim_for_all_namespaces, **kw)
            items += list(doc.get("items") or [])
            if len(items) > MAX_CLAIMS:
                raise ValueError(f"more than {MAX_CLAIMS} ResourceClaims in the cluster: not listing them all")
            token = str((doc.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    async def list_slices(self, driver: str, node: str) -> list[Obj]:
        doc = await self._run(self.api.list_resource_slice,
                              field_selector=f"spec.driver={driver},spec.nodeName={node}")
        return list(doc.get("items") or [])

    async def get_slice(self, name: str) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj: Obj = await self._run(self.api.read_resource_slice, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return obj

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
