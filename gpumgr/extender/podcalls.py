"""The three API calls of a bind — read a pod, merge-patch its annotations, create its Binding — over aiohttp,
and those of the leader election's Lease (read, create, replace with its resourceVersion).

Bind latency is what the scheduler waits on, so these calls stay on the event loop (no thread hand-off, no model
classes). Where and how to connect (server URL, bearer token or basic auth, CA, client certificate, TLS
verification and server name) comes from the `kubernetes` client's Configuration, loaded from the kubeconfig or
the in-cluster service account, so both clients always talk to the same API server as the same user; the auth
headers are the client's own (`auth_settings()`), so a token it refreshes (in-cluster) is fresh for every call.
HTTP proxies are not supported.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any
from urllib.parse import quote

import aiohttp

from gpumgr.extender.kubeaccess import CALL_TIMEOUT, CONNECT_TIMEOUT, MERGE_PATCH, ApiCallError

AUTH_TTL_S = 30.0


class PodCalls:
    def __init__(self, configuration: Any):
        self._cfg = configuration
        self._base = str(configuration.host).rstrip("/")
        self._tls: dict[str, Any] = {}
        if self._base.startswith("https:"):
            self._tls["ssl"] = _ssl_context(configuration)
            if getattr(configuration, "tls_server_name", None):
                self._tls["server_hostname"] = configuration.tls_server_name
        self._session: aiohttp.ClientSession | None = None
        self._auth_cache: tuple[float, dict[str, str]] | None = None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call("GET", _pod_path(namespace, name))

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch; a `metadata.resourceVersion` in it makes the API answer 409 when stale."""
        return await self._call("PATCH", _pod_path(namespace, name), patch, MERGE_PATCH)

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods of one namespace that match a label selector (one page: a handful of extender pods)."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods?labelSelector={quote(label_selector)}"
        items = (await self._call("GET", path)).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, resource_version: str = "") -> None:
        """Create the pod's Binding. `uid` and `resource_version` are preconditions the API server enforces
        (BindingREST.setPodHostAndAnnotations): it answers 409 when the pod was replaced, or written since."""
        meta: dict[str, str] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self._call("POST", _pod_path(namespace, name) + "/binding", body)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call("GET", _lease_path(namespace, name))

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", _lease_path(namespace, ""), body)

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT; the `metadata.resourceVersion` in `body` makes the API answer 409 when someone wrote since."""
        return await self._call("PUT", _lease_path(namespace, name), body)

    async def _call(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT, sock_connect=CONNECT_TIMEOUT),
                headers={"Accept": "application/json", "User-Agent": "gpumgr-extender"})
        try:
            headers = await self._headers()
        except Exception as e:  # noqa: BLE001 - a kubeconfig exec plugin or token file that fails
            raise ApiCallError(0, f"cannot make the API credentials: {type(e).__name__}: {e}") from None
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":")).encode()
        try:
            async with self._session.request(method, self._base + path, data=data, headers=headers,
                                             **self._tls) as resp:
                raw = await resp.read()
                status = resp.status
                reason = resp.reason or ""
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiCallError(0, f"{type(e).__name__}: {e}") from None
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = None
        if not 200 <= status <= 299:
            if isinstance(doc, dict) and doc.get("message"):
                raise ApiCallError(status, f"{status} {doc.get('reason') or reason}: {doc['message']}")
            raise ApiCallError(status, f"{status} {reason}")
        if not isinstance(doc, dict):
            raise ApiCallError(0, "the API answered with something that is not a JSON object")
        return doc

    async def _headers(self) -> dict[str, str]:
        """The auth headers, computed off the event loop (a kubeconfig exec plugin may run a subprocess to
        refresh a token) and reused for AUTH_TTL_S."""
        now = time.monotonic()
        if self._auth_cache is None or now - self._auth_cache[0] > AUTH_TTL_S:
            headers = await asyncio.get_running_loop().run_in_executor(None, self._auth)
            self._auth_cache = (now, headers)
        return dict(self._auth_cache[1])

    def _auth(self) -> dict[str, str]:
        """Headers the `kubernetes` client would send (a bearer token, refreshed by the client's hook)."""
        out = {}
        for setting in self._cfg.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                out[str(setting["key"])] = str(setting["value"])
        return out


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def _lease_path(namespace: str, name: str) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return f"{base}/{quote(name, safe='')}" if name else base


def _ssl_context(cfg: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
