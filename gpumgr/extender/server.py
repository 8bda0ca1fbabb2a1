"""`ExtenderServer`: the extender's HTTP server, its cluster view and the watches that feed it.

    server = ExtenderServer(kubeconfig_path_or_api_client, policy="binpack", prefix="/gpumgr")
    port = await server.start("127.0.0.1", 0)     # 0: any free port
    await server.wait_ready(10)                   # the first list of nodes and pods is in
    ...
    await server.stop()

An empty `api` means the in-cluster service account.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpumgr import podspec
from gpumgr.extender.binder import Binder
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.kubeaccess import KubeAccess
from gpumgr.extender.podcalls import PodCalls
from gpumgr.extender.score import POLICIES
from gpumgr.extender.watcher import Watcher

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/gpumgr"
MAX_BODY_BYTES = 64 * 1024 * 1024  # a Nodes list of thousands of full Node objects fits; NodeNames is far smaller


class ExtenderServer:
    def __init__(self, api: Any, policy: str = "binpack", prefix: str = DEFAULT_PREFIX, *,
                 max_body_bytes: int = MAX_BODY_BYTES):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
        self.policy = policy
        self.prefix = normalize_prefix(prefix)
        self.max_body_bytes = max_body_bytes
        self.view = ClusterView()
        self._api = api
        self._access: KubeAccess | None = None
        self._calls: PodCalls | None = None
        self._watchers: list[Watcher] = []
        self._runner: Any = None

    @property
    def ready(self) -> bool:
        return self.view.ready

    async def start(self, host: str = "0.0.0.0", port: int = 3456) -> int:
        """Start the watches and the HTTP server; returns the port listened on."""
        from aiohttp import web

        from gpumgr.extender.handlers import build_app

        if self._runner is not None:
            raise RuntimeError("the extender is already started")
        loop = asyncio.get_running_loop()
        access = await loop.run_in_executor(None, KubeAccess, self._api)
        self._access = access
        view = self.view
        self._watchers = [
            Watcher(access, "nodes", loop, _node_entry, lambda items: view.replace_nodes(dict(items)),
                    lambda kind, e: view.remove_node(e[0]) if kind == "DELETED" else view.set_node(*e)),
            Watcher(access, "pods", loop, _gpu_pod, view.replace_pods,
                    lambda kind, pod: view.remove_pod(pod) if kind == "DELETED" else view.set_pod(pod)),
        ]
        for w in self._watchers:
            w.start()
        self._calls = PodCalls(access.configuration)
        app = build_app(view, Binder(view, self._calls), self.policy, self.prefix, self.max_body_bytes)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, reuse_address=True)
            await site.start()
        except BaseException:
            await runner.cleanup()
            await self._stop_watches()
            raise
        self._runner = runner
        bound = int(runner.addresses[0][1])
        log.info("gpumgr extender listening on %s:%d%s/{filter,prioritize,bind} (policy %s)", host, bound,
                 self.prefix, self.policy)
        return bound

    async def wait_ready(self, timeout: float) -> None:
        """Until the first list of nodes and pods is in; raises TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not self.view.ready:
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self._stop_watches()

    async def _stop_watches(self) -> None:
        watchers, self._watchers = self._watchers, []
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.stop) for w in watchers))
        access, self._access = self._access, None
        if access is not None:
            access.close()
        calls, self._calls = self._calls, None
        if calls is not None:
            await calls.close()


def normalize_prefix(prefix: str) -> str:
    """`gpumgr/` → `/gpumgr`; "" and "/" → "" (routes at /filter, ...)."""
    p = "/" + prefix.strip().strip("/")
    if any(c.isspace() or c in "{}?#" for c in p):
        raise ValueError(f"--url-prefix {prefix!r}: must be a plain URL path")
    return "" if p == "/" else p


def _node_entry(node: dict[str, Any]) -> tuple[str, str | None]:
    meta = node.get("metadata") or {}
    return str(meta.get("name") or ""), (meta.get("annotations") or {}).get(podspec.ANN_NODE_INVENTORY)


def _gpu_pod(pod: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return pod if podspec.is_gpu_pod(pod) else None
    except (ValueError, AttributeError):
        return None
