"""A hostile (or broken) Kubernetes API server on 127.0.0.1, for the real clients of gpumgr to talk to.

    async with HostileApi(list_mode="huge", watch_mode="bookmarks") as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        ...
        api.lists, api.watches, api.bookmarks_sent

List modes (every list of every resource): "huge" ignores `limit` and streams `huge_mib` MiB of pods in one
answer; "many" ignores `limit` and answers `many` tiny objects at once; "endless" always answers one object and
a `continue` token; "garbage" answers JSON cut in the middle; "trickle" sends a byte every 0.2 s, never ending;
"normal" answers an empty list. Watch modes: "bookmarks" streams fat bookmarks as fast as
the client reads them; "gone" answers 410 Gone at once; "hold" sends nothing and keeps the stream open.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from gpumgr.sim.kubeapi.kubeconfig import write_kubeconfig

PAD = "x" * 65536  # a bookmark is tiny; a hostile one carries a fat annotation to fill buffers quickly


class HostileApi:
    def __init__(self, list_mode: str = "normal", watch_mode: str = "hold", *, huge_mib: int = 256,
                 many: int = 30_000):
        self.list_mode = list_mode
        self.watch_mode = watch_mode
        self.huge_mib = huge_mib
        self.many = many
        self.lists = 0
        self.watches = 0
        self.bookmarks_sent = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> HostileApi:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner, self.url = await _serve(app)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def write_kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(path, self.url)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("true", "1"):
            self.watches += 1
            return await self._watch(request)
        self.lists += 1
        kind = "NodeList" if request.path.endswith("/nodes") else "PodList"
        if self.list_mode == "huge":
            return await self._huge(request, kind)
        if self.list_mode == "many":
            items = [{"metadata": {"name": f"o{i}", "uid": f"u{i}"}} for i in range(self.many)]
            return web.json_response({"kind": kind, "metadata": {"resourceVersion": "7"}, "items": items})
        if self.list_mode == "garbage":
            return web.Response(body=b'{"kind": "PodList", "items": [{"metadata": ', content_type="application/json")
        if self.list_mode == "trickle":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            try:
                await resp.write(b'{"kind":"PodList","items":[')
                while True:
                    await asyncio.sleep(0.2)
                    await resp.write(b" ")
            except (ConnectionError, RuntimeError, asyncio.CancelledError):
                pass
            return resp
        if self.list_mode == "endless":
            n = self.lists
            return web.json_response({"kind": kind, "metadata": {"resourceVersion": "7", "continue": f"c{n}"},
                                      "items": [{"metadata": {"name": f"o{n}", "uid": f"u{n}"}}]})
        return web.json_response({"kind": kind, "metadata": {"resourceVersion": "7"}, "items": []})

    async def _huge(self, request: web.Request, kind: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        pod = json.dumps({"metadata": {"name": "p", "namespace": "default", "uid": "u",
                                       "annotations": {"a": "y" * 4000}},
                          "spec": {"nodeName": "n", "containers": [{"name": "c"}]}}).encode()
        chunk = b",".join([pod] * 256) + b","
        try:
            await resp.write(b'{"kind":"%s","metadata":{"resourceVersion":"7"},"items":[' % kind.encode())
            for _ in range(self.huge_mib * (1 << 20) // len(chunk)):
                await resp.write(chunk)
            await resp.write(pod + b"]}")
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client hung up: what we want
        return resp

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        if self.watch_mode == "gone":
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                                      "reason": "Expired", "message": "too old resource version"}, status=410)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            if self.watch_mode == "bookmarks":
                rv = 100
                kind = "Node" if request.path.endswith("/nodes") else "Pod"
                while True:
                    rv += 1
                    line = json.dumps({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(rv), "annotations": {"pad": PAD}}}}).encode() + b"\n"
                    await resp.write(line)
                    self.bookmarks_sent += 1
            else:
                await asyncio.sleep(3600)
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            pass
        return resp


class ThreadedHostileApi:
    """`HostileApi` on its own event loop in a thread: the client under test has its loop (or thread) to itself,
    so what it reads is limited by its own pace, not by sharing a loop with the server."""

    def __init__(self, *args: object, **kw: object):
        self.api = HostileApi(*args, **kw)  # type: ignore[arg-type]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> HostileApi:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.api.__aenter__(), self._loop).result(30)
        return self.api

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.api.__aexit__(None, None, None), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


class SwitchingProxy:
    """A proxy in front of a real (test) API server that can turn hostile: "pass" forwards every call (watches
    streamed); "flood" answers lists with `huge_mib` MiB ignoring `limit`, watches with a flood of fat bookmarks
    and anything else with 500; "expire" is the same with every watch answered 410 Gone (so the client lists
    again, and again); "gone" drops every connection without an answer (a server away for minutes).
    Switching mode cuts the streams in flight, so the client meets the new behaviour at once."""

    def __init__(self, upstream: str, huge_mib: int = 256):
        self.upstream = upstream.rstrip("/")
        self.mode = "pass"
        self.hostile = {"flood": HostileApi("huge", "bookmarks", huge_mib=huge_mib),
                        "expire": HostileApi("huge", "gone", huge_mib=huge_mib)}
        self.calls: dict[str, int] = {}
        self._open: set[asyncio.BaseTransport] = set()
        self._runner: web.AppRunner | None = None
        self._session: Any = None
        self.url = ""

    def switch(self, mode: str) -> None:
        self.mode = mode
        for t in list(self._open):
            t.close()
        self._open.clear()

    async def __aenter__(self) -> SwitchingProxy:
        import aiohttp

        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, self.url = await _serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.switch("gone")
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls[self.mode] = self.calls.get(self.mode, 0) + 1
        transport = request.transport
        if self.mode == "gone":
            if transport is not None:
                transport.close()
            raise asyncio.CancelledError
        if transport is not None:
            self._open.add(transport)
        try:
            if self.mode in self.hostile:
                if request.method == "GET":
                    return await self.hostile[self.mode]._handle(request)
                return web.json_response({"kind": "Status", "code": 500, "message": "hostile"}, status=500)
            return await self._forward(request)
        except (ConnectionError, OSError):  # the stream was cut by a switch, or the client went away
            if transport is not None:
                transport.close()
            raise asyncio.CancelledError from None
        finally:
            if transport is not None:
                self._open.discard(transport)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        import aiohttp

        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "accept")}
        # the body keeps its media type (a bare bytes body went out as application/octet-stream: writes got 415)
        data = aiohttp.BytesPayload(body, content_type=request.headers.get("Content-Type", "application/json")) \
            if body else None
        async with self._session.request(request.method, self.upstream + request.rel_url.path_qs, data=data,
                                         headers=headers, allow_redirects=False) as up:
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": up.headers.get("Content-Type", "application/json")})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` served on a free port of 127.0.0.1: its runner (to clean up) and its URL."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    return runner, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"  # type: ignore[attr-defined]


def met_a_huge_list(proxy: SwitchingProxy, log: Path) -> bool:
    """The agent writing `log` listed through `proxy` in its "expire" mode and cut the 256 MiB answer off."""
    return proxy.hostile["expire"].lists >= 1 and "an answer over 33554432 bytes" in log.read_text(errors="replace")
