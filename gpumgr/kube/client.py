"""The few API calls the agent makes, as coroutines over gpumgr.kube.rest (aiohttp; no `kubernetes` import).

Pods and nodes come back as API JSON dicts (camelCase), the same shape the extender receives. Only the DRA front
end uses the official client: `api_client` builds one from the same settings on first use, so the device-plugin
agent never imports `kubernetes` (~0.3 s and ~35 MiB).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import tempfile
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpumgr.kube.kubeconfig import ClusterAccess, in_cluster, load_kubeconfig
from gpumgr.kube.pace import MAX_PAGE_BYTES, page_count_cap
from gpumgr.kube.rest import STRATEGIC_MERGE_PATCH, ApiError, KubeRest

log = logging.getLogger("gpumgr.kube")

CONFLICT_RETRIES = 8
POD_CONDITION = "gpumgr.io/GPUAllocated"  # condition set False on a pod failed because its GPU share cannot hold it
LIST_PAGE = 500  # pods per page of a list
# Pods on one node a list may hold: kubelets run at most a few hundred (--max-pods), plus terminated pods not yet
# collected; a list past this is a broken API server (or a node gpumgr cannot serve), refused with an error.
MAX_NODE_PODS = 5_000
TIMEOUT = (5, 30)  # (connect, read) seconds for every call: a black-holed API server must not hang a call


class KubeClient:
    def __init__(self, access: ClusterAccess):
        self.access = access
        self.rest = KubeRest(access, connect_timeout=TIMEOUT[0], read_timeout=TIMEOUT[1])
        self._api_client: Any = None
        self._pem_dir: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def connect(cls, kubeconfig: str | None) -> KubeClient:
        """From a kubeconfig file, or in-cluster when `kubeconfig` is empty. Raises KubeConfigError (an
        InputError: one line naming the file and field) when the settings cannot be used."""
        return cls(load_kubeconfig(kubeconfig) if kubeconfig else in_cluster())

    @property
    def api_client(self) -> Any:
        """An official `kubernetes.client.ApiClient` with the same settings, made (and imported) on first use."""
        if self._api_client is None:
            from kubernetes import client

            self._pem_dir = tempfile.TemporaryDirectory(prefix="gpumgr-kube-")
            self._api_client = client.ApiClient(self.access.official_configuration(Path(self._pem_dir.name)))
        return self._api_client

    def close(self) -> None:
        self.rest.close()
        self._close_official()

    async def aclose(self) -> None:
        await self.rest.aclose()
        self._close_official()

    def _close_official(self) -> None:
        if self._api_client is not None:
            self._api_client.close()
            self._api_client = None
        if self._pem_dir is not None:
            self._pem_dir.cleanup()
            self._pem_dir = None

    # -- pods -----------------------------------------------------------------------------------------------
    async def list_node_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        """The pods bound to `node` and the list's resourceVersion (to start a watch from). Read in pages of
        LIST_PAGE, each within MAX_PAGE_BYTES, at most MAX_NODE_PODS in all: a server that ignores `limit` or
        never stops sending pages gets an ApiError naming the bound, not the agent's memory."""
        items: list[dict[str, Any]] = []
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(LIST_PAGE)}
        rv = ""
        for page in range(page_count_cap(MAX_NODE_PODS, LIST_PAGE)):
            res = await self.rest.request("GET", "/api/v1/pods", params=params, max_bytes=MAX_PAGE_BYTES)
            got = res.get("items") or []
            items += [p for p in got if isinstance(p, dict)] if isinstance(got, list) else []
            meta = res.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "")
            if len(items) > MAX_NODE_PODS:
                raise ApiError(200, "TooManyPods", f"the list of the pods on node {node} goes past {MAX_NODE_PODS} "
                               f"({len(items)} in {page + 1} pages): not read further (a broken API server?)")
            cont = str(meta.get("continue") or "")
            if not cont:
                return items, rv
            params = {**params, "continue": cont}
        raise ApiError(200, "TooManyPages", f"the list of the pods on node {node} did not end after {page + 1} pages")

    def watch_node_pods(self, node: str, resource_version: str,
                        timeout_s: int) -> AsyncGenerator[dict[str, Any], None]:
        """Watch events ({"type", "object"}) of the pods on `node` after `resource_version`, bookmarks included,
        until the server ends the watch (after about `timeout_s`)."""
        params = {"fieldSelector": f"spec.nodeName={node}", "resourceVersion": resource_version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)}
        # the client's own generator, not a wrapper: closing it closes the stream at once
        return self.rest.watch("/api/v1/pods", params, read_timeout=timeout_s + 15)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.rest.request("GET", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> bool:
        """Merge the annotations into the pod, retrying on conflicts. False when the pod is gone."""
        for attempt in range(CONFLICT_RETRIES):
            body: dict[str, Any] = {"metadata": {"annotations": dict(annotations)}}
            try:
                await self.rest.request("PATCH", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}", body=body,
                                        content_type=STRATEGIC_MERGE_PATCH)
                return True
            except ApiError as e:
                if e.status == 404:
                    return False
                if e.status == 409 and attempt + 1 < CONFLICT_RETRIES:
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                raise
        return False

    async def record_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace", "default")
        involved = {k: v for k, v in (("kind", "Pod"), ("namespace", ns), ("name", meta.get("name")),
                                      ("uid", meta.get("uid"))) if v is not None}
        ev = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{meta.get('name', 'pod')}."},
              "involvedObject": involved, "reason": reason, "message": message, "type": kind,
              "source": {"component": "gpumgr-agent"}}
        try:
            await self.rest.request("POST", f"/api/v1/namespaces/{_q(ns)}/events", body=ev)
        except Exception as e:  # noqa: BLE001 - events are best effort
            log.debug("could not record event %s on %s/%s: %s", reason, ns, meta.get("name"), e)

    async def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        """Mark the pod Failed with `reason` and `message`, and a `GPUAllocated=False` condition saying the same
        (its controller then recreates it). False when the pod is gone."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"phase": "Failed", "reason": reason, "message": message, "conditions": [
            {"type": POD_CONDITION, "status": "False", "reason": reason, "message": message,
             "lastTransitionTime": now}]}}
        try:
            # strategic merge: conditions merge by type, the kubelet's own conditions stay
            await self.rest.request("PATCH", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/status", body=body,
                                    content_type=STRATEGIC_MERGE_PATCH)
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    # -- nodes ----------------------------------------------------------------------------------------------
    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.rest.request("GET", f"/api/v1/nodes/{_q(name)}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def patch_node_metadata(self, name: str, labels: Mapping[str, str | None] | None = None,
                                  annotations: Mapping[str, str | None] | None = None) -> None:
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if meta:
            await self.rest.request("PATCH", f"/api/v1/nodes/{_q(name)}", body={"metadata": meta},
                                    content_type=STRATEGIC_MERGE_PATCH)


def _q(segment: str) -> str:
    """One path segment, escaped, so that a name can never reach another path."""
    if segment in ("", ".", ".."):
        raise ValueError(f"not an object name: {segment!r}")
    return quote(str(segment), safe="")
