"""Running the test API server: on the caller's event loop (`KubeApiServer`) or in a thread of its own
(`ThreadedKubeApiServer`, for synchronous tests and the demo)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from types import TracebackType

from aiohttp import web

from gpumgr.sim.kubeapi.kubeconfig import write_kubeconfig
from gpumgr.sim.kubeapi.routes import build_app
from gpumgr.sim.kubeapi.store import KubeStore

_START_TIMEOUT = 10.0


class KubeApiServer:
    """The API server on the current event loop, on 127.0.0.1 (a free port unless `port` is given).

    Pass the same `store` to a new server to "restart the API server" with the cluster state kept.
    """

    def __init__(self, store: KubeStore | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 bookmark_interval: float = 5.0) -> None:
        self.store = store if store is not None else KubeStore()
        self._host = host
        self._port = port
        self._bookmark_interval = bookmark_interval
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. `http://127.0.0.1:40123`. Only valid while started."""
        if self._url is None:
            raise RuntimeError("the API server is not started")
        return self._url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def start(self) -> str:
        if self._runner is not None:
            raise RuntimeError("the API server is already started")
        app = build_app(self.store, bookmark_interval=self._bookmark_interval)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port, reuse_address=True)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._port = port  # a restart comes back on the same port
        self._url = f"http://{host}:{port}"
        return self._url

    async def stop(self) -> None:
        runner, self._runner, self._url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    def write_kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(path, self.url)

    async def __aenter__(self) -> KubeApiServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


class ThreadedKubeApiServer:
    """`KubeApiServer` on its own event loop in a daemon thread; `start()` returns the base URL."""

    def __init__(self, store: KubeStore | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 bookmark_interval: float = 5.0) -> None:
        self._server = KubeApiServer(store, host=host, port=port, bookmark_interval=bookmark_interval)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def store(self) -> KubeStore:
        return self._server.store

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> str:
        if self._thread is not None:
            raise RuntimeError("the API server is already started")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="gpumgr-kubeapi", daemon=True)
        thread.start()
        future = asyncio.run_coroutine_threadsafe(self._server.start(), loop)
        try:
            url = future.result(timeout=_START_TIMEOUT)
        except BaseException:
            _stop_loop(loop, thread)
            raise
        self._loop, self._thread = loop, thread
        return url

    def stop(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._server.stop(), loop).result(timeout=_START_TIMEOUT)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        finally:
            _stop_loop(loop, thread)

    def write_kubeconfig(self, path: str | Path) -> Path:
        return self._server.write_kubeconfig(path)

    def __enter__(self) -> ThreadedKubeApiServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=_START_TIMEOUT)
    if not thread.is_alive():
        loop.close()
