"""The few API calls the agent makes, as coroutines (the `kubernetes` client blocks: calls run in a thread).

Pods and nodes come back as API JSON dicts (camelCase), the same shape the extender receives.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

log = logging.getLogger("gpumgr.kube")
T = TypeVar("T")

CONFLICT_RETRIES = 8
POD_CONDITION = "gpumgr.io/GPUAllocated"  # condition set False on a pod failed because its GPU share cannot hold it
TIMEOUT = (5, 30)  # (connect, read) seconds for every call: a black-holed API server must not hold a thread forever


class KubeClient:
    def __init__(self, api_client: Any):
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None) -> KubeClient:
        """From a kubeconfig file, or in-cluster when `kubeconfig` is empty."""
        from kubernetes import client, config

        if kubeconfig:
            api = config.new_client_from_config(config_file=kubeconfig)
        else:
            config.load_incluster_config()
            api = client.ApiClient()
        return cls(api)

    def close(self) -> None:
        self.api_client.close()

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))

    def to_dict(self, obj: Any) -> dict[str, Any]:
        return dict(self.api_client.sanitize_for_serialization(obj))

    # -- pods -----------------------------------------------------------------------------------------------
    def list_node_pods_sync(self, node: str) -> tuple[list[dict[str, Any]], str]:
        res = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _request_timeout=TIMEOUT)
        rv = res.metadata.resource_version if res.metadata else ""
        return [self.to_dict(p) for p in res.items], str(rv or "")

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = await self._run(self.core.read_namespaced_pod, name, namespace, _request_timeout=TIMEOUT)
            return self.to_dict(pod)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> bool:
        """Merge the annotations into the pod, retrying on conflicts. False when the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(CONFLICT_RETRIES):
            body: dict[str, Any] = {"metadata": {"annotations": dict(annotations)}}
            try:
                await self._run(self.core.patch_namespaced_pod, name, namespace, body, _request_timeout=TIMEOUT)
                return True
            except ApiException as e:
                if e.status == 404:
                    return False
                if e.status == 409 and attempt + 1 < CONFLICT_RETRIES:
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                raise
        return False

    async def record_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        from kubernetes import client

        meta = pod.get("metadata") or {}
        ns = meta.get("namespace", "default")
        ev = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name', 'pod')}."),
            involved_object=client.V1ObjectReference(kind="Pod", namespace=ns, name=meta.get("name"),
                                                     uid=meta.get("uid")),
            reason=reason, message=message, type=kind, source=client.V1EventSource(component="gpumgr-agent"),
        )
        try:
            await self._run(self.core.create_namespaced_event, ns, ev, _request_timeout=TIMEOUT)
        except Exception as e:  # noqa: BLE001 - events are best effort
            log.debug("could not record event %s on %s/%s: %s", reason, ns, meta.get("name"), e)

    async def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        """Mark the pod Failed with `reason` and `message`, and a `GPUAllocated=False` condition saying the same
        (its controller then recreates it). False when the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"phase": "Failed", "reason": reason, "message": message, "conditions": [
            {"type": POD_CONDITION, "status": "False", "reason": reason, "message": message,
             "lastTransitionTime": now}]}}
        try:
            await self._run(self.core.patch_namespaced_pod_status, name, namespace, body, _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    # -- nodes ----------------------------------------------------------------------------------------------
    async def get_node(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.to_dict(await self._run(self.core.read_node, name, _request_timeout=TIMEOUT))
        except ApiException as e:
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
            await self._run(self.core.patch_node, name, {"metadata": meta}, _request_timeout=TIMEOUT)
