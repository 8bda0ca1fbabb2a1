"""Serving the plugin sockets and registering them with the kubelet, again whenever the kubelet restarts.

Each plugin's socket is served before Register is sent. A watch on the plugin directory (polled every 100 ms:
no inotify dependency, and it sees a deleted socket as well as a new `kubelet.sock`) restarts the servers and
registers again when `kubelet.sock` is re-created or a plugin socket disappears; Register is retried with
backoff while the kubelet is not ready. The process never exits for this and no allocation is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpumgr.deviceplugin.mig import MigPluginServicer
from gpumgr.deviceplugin.servicer import PluginServicer
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger("gpumgr.deviceplugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
POLL_S = 0.1
BACKOFF_MAX_S = 5.0


class PluginSupervisor:
    def __init__(self, plugin_dir: Path, plugins: list[PluginSpec],
                 on_register: Callable[[str, bool], None] | None = None):
        self.plugin_dir = Path(plugin_dir)
        self.plugins = plugins
        self.on_register = on_register  # (resource, is_re_registration)
        self._servers: dict[str, grpc.aio.Server] = {}
        self.registered: dict[str, bool] = {p.resource: False for p in plugins}
        self._tasks: list[asyncio.Task[None]] = []
        self._register_task: asyncio.Task[None] | None = None
        self._kubelet_id: tuple[int, int] | None = None
        self._first = True

    @property
    def ready(self) -> bool:
        return all(self.registered.values())

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        await self._serve_all()
        self._kubelet_id = self._stat_kubelet()
        self._register_task = asyncio.create_task(self._register_all())
        self._tasks.append(asyncio.create_task(self._watch()))

    async def stop(self) -> None:
        for t in [*self._tasks, *([self._register_task] if self._register_task else [])]:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        await self._stop_servers()

    # -- serving --------------------------------------------------------------------------------------------
    async def _serve_all(self) -> None:
        for spec in self.plugins:
            path = self.plugin_dir / spec.socket
            path.unlink(missing_ok=True)
            server = grpc.aio.server()
            pb_grpc.add_DevicePluginServicer_to_server(spec.servicer, server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers[spec.resource] = server
            log.info("serving %s on %s", spec.resource, path)

    async def _stop_servers(self) -> None:
        servers, self._servers = self._servers, {}
        for s in servers.values():
            await s.stop(grace=0.5)

    # -- registering ----------------------------------------------------------------------------------------
    async def _register_all(self) -> None:
        again = not self._first
        self._first = False
        await asyncio.gather(*(self._register(spec, again) for spec in self.plugins))

    async def _register(self, spec: PluginSpec, again: bool) -> None:
        delay = 0.05
        kubelet = self.plugin_dir / KUBELET_SOCKET
        while True:
            try:
                async with grpc.aio.insecure_channel(f"unix://{kubelet}") as ch:
                    await pb_grpc.RegistrationStub(ch).Register(pb.RegisterRequest(
                        version=API_VERSION, endpoint=spec.socket, resource_name=spec.resource,
                        options=spec.servicer.options()), timeout=10)
                self.registered[spec.resource] = True
                log.info("registered %s with the kubelet (%s)", spec.resource, "again" if again else "first time")
                if self.on_register:
                    self.on_register(spec.resource, again)
                return
            except grpc.aio.AioRpcError as e:
                log.warning("registering %s with the kubelet failed (%s: %s); retrying in %.2fs", spec.resource,
                            e.code().name, e.details(), delay)
            except Exception as e:  # noqa: BLE001 - keep trying: the agent must never stop registering
                log.warning("registering %s with the kubelet failed (%s); retrying in %.2fs", spec.resource, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    # -- watching -------------------------------------------------------------------------------------------
    def _stat_kubelet(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.plugin_dir / KUBELET_SOCKET)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self._check_once()
            except Exception:  # noqa: BLE001 - one failed round (a directory being re-created) must not end the watch
                log.exception("serving the plugins again failed; retrying")
                self._kubelet_id = None  # force another attempt on the next round
                await asyncio.sleep(0.5)

    async def _check_once(self) -> None:
        kubelet = self._stat_kubelet()
        missing = [p.socket for p in self.plugins if not (self.plugin_dir / p.socket).exists()]
        recreated = kubelet is not None and kubelet != self._kubelet_id
        serving = len(self._servers) == len(self.plugins)
        if not recreated and not missing and serving:
            return
        log.warning("kubelet restart seen (%s): serving and registering again",
                    "kubelet.sock re-created" if recreated else f"plugin sockets removed: {missing}")
        self._kubelet_id = kubelet
        for r in self.registered:
            self.registered[r] = False
        if self._register_task:
            self._register_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._register_task
        await self._stop_servers()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        await self._serve_all()
        self._register_task = asyncio.create_task(self._register_all())


@dataclass(frozen=True)
class PluginSpec:
    resource: str
    socket: str
    servicer: PluginServicer | MigPluginServicer
