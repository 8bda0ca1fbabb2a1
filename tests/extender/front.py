"""One address in front of several extender replicas, as the chart's Service is: each request goes to a backend
whose `/readyz` (on its probe port) last answered 200 AND whose pod, read from the API, carries the label
`gpumgr.io/extender-leader: "true"` (the Service's selector; the leader sets it on its own pod).

    async with Front([Backend(url, probe_url, pod="ext-0"), ...], api_store, namespace) as front:
        front.url   # http://127.0.0.1:<port>

Readiness and labels are polled every `interval` seconds (a probe with a short timeout: a stopped or killed
process is dropped). A request finds no such backend: 503. A backend that does not answer (killed
mid-request): 502, as a proxy would; the caller (kube-scheduler) retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from gpumgr.extender.leaderlabel import LEADER_LABEL


@dataclass
class Backend:
    url: str  # http://127.0.0.1:<port>
    probe_url: str  # http://127.0.0.1:<probe port>
    pod: str = ""  # its Pod in the API (POD_NAME)
    ready: bool = False
    labelled: bool = False


class Front:
    def __init__(self, backends: list[Backend], store: Any, namespace: str, interval: float = 0.1,
                 probe_timeout: float = 0.5, call_timeout: float = 30.0):
        self.backends = backends
        self.store = store  # the API test server's store: where the pods' labels are read
        self.namespace = namespace
        self.interval = interval
        self.probe_timeout = probe_timeout
        self.call_timeout = call_timeout
        self.url = ""
        self.forwarded: dict[str, int] = {}  # backend url -> requests forwarded
        self._turn = itertools.count()
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Front:
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        await self._probe_all()
        self._poller = asyncio.get_running_loop().create_task(self._poll())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def ready(self) -> list[Backend]:
        return [b for b in self.backends if b.ready and b.labelled]

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._probe_all()

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in self.backends))
        for b in self.backends:
            labels = ((self.store.get_pod(self.namespace, b.pod) or {}).get("metadata") or {}).get("labels") or {}
            b.labelled = labels.get(LEADER_LABEL) == "true"

    async def _probe(self, backend: Backend) -> None:
        assert self._http is not None
        try:
            async with self._http.get(backend.probe_url + "/readyz",
                                      timeout=aiohttp.ClientTimeout(total=self.probe_timeout)) as r:
                await r.read()
                backend.ready = r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            backend.ready = False

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        ready = self.ready()
        if not ready:
            return web.json_response({"Error": "front: no ready backend"}, status=503)
        backend = ready[next(self._turn) % len(ready)]
        self.forwarded[backend.url] = self.forwarded.get(backend.url, 0) + 1
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        try:
            async with self._http.request(request.method, backend.url + request.path_qs, data=body,
                                          headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=self.call_timeout)) as r:
                raw = await r.read()
                return web.Response(body=raw, status=r.status, content_type=r.content_type)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return web.json_response({"Error": f"front: backend {backend.url} failed: {type(e).__name__}"},
                                     status=502)
