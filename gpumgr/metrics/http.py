"""The agent's HTTP endpoints (port 5678 by default, as gpu-manager):

- `/metric` (and `/metrics`): Prometheus text; the node is read and rendered in a worker thread, never on the
  event loop;
- `/graph`: the topology tree with free capacity, JSON (`?format=text`: the tree as `gpumgr topo` draws it);
- `/usage`: cards, holders, requests and usage, JSON;
- `/healthz`: 200 while the process serves; `/readyz`: 200 once `ready()` says so, else 503.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from gpumgr.metrics.events import AgentMetrics
from gpumgr.metrics.usage import UsageReader
from gpumgr.metrics.views import graph_json, usage_json
from gpumgr.requests.podspec import ascii_uint
from gpumgr.topology.render import render_tree

log = logging.getLogger("gpumgr.metrics")

METRICS = web.AppKey("metrics", AgentMetrics)
READER = web.AppKey("reader", UsageReader)
READY: web.AppKey[Callable[[], bool]] = web.AppKey("ready")
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
SCRAPE_THREADS = 2
# every name and label is a legacy Prometheus name, so the text is exactly format 0.0.4, which every scraper reads
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_app(metrics: AgentMetrics, reader: UsageReader, ready: Callable[[], bool] = lambda: True) -> web.Application:
    """The app to mount or serve. Registers the node collector of `reader` on `metrics` (once). Scrapes run on
    a small pool of their own, so a slow NVML call never queues behind (or ahead of) checkpoint writes."""
    metrics.attach(reader)
    app = web.Application()
    app[METRICS] = metrics
    app[READER] = reader
    app[READY] = ready
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=SCRAPE_THREADS, thread_name_prefix="gpumgr-scrape")
    app.on_cleanup.append(_shutdown_executor)
    app.router.add_get("/metric", _metric)
    app.router.add_get("/metrics", _metric)
    app.router.add_get("/graph", _graph)
    app.router.add_get("/usage", _usage)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


async def start_http(app: web.Application, host: str = "0.0.0.0", port: int = 5678) -> MetricsServer:
    """Serve `app` on host:port (port 0: any free port). Raises OSError naming the address if it is taken."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise OSError(e.errno, f"cannot serve metrics on {host}:{port}: {e.strerror}") from None
    bound = port
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            bound = int(addr[1])
            break
    return MetricsServer(runner=runner, host=host, port=bound)


def parse_addr(addr: str, default_port: int = 5678) -> tuple[str, int]:
    """`host:port`, `:port`, `[v6]:port` or `host` → (host, port); ValueError with the address otherwise."""
    text = addr.strip()
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"metrics address {addr!r}: missing ']'")
        host, rest = text[1:end], text[end + 1:]
        port_text = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not port_text:
        port = default_port
    elif (number := ascii_uint(port_text, 5)) is not None and number <= 65535:
        port = number
    else:
        raise ValueError(f"metrics address {addr!r}: port must be 0-65535")
    return host or "0.0.0.0", port


# -- handlers ------------------------------------------------------------------------------------------------------
async def _in_thread(request: web.Request, fn: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(request.app[EXECUTOR], fn)


async def _metric(request: web.Request) -> web.Response:
    registry = request.app[METRICS].registry
    try:
        body: bytes = await _in_thread(request, lambda: generate_latest(registry))
    except Exception as e:
        log.exception("scrape failed")
        return web.Response(status=500, text=f"scrape failed: {type(e).__name__}: {e}\n")
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _graph(request: web.Request) -> web.Response:
    reader = request.app[READER]
    state = reader.state
    fmt = request.query.get("format", "json")
    cordoned = reader.cordon().cards if reader.cordon is not None else None
    if fmt == "text":
        return web.Response(text=render_tree(state.topology, state.ledger, state.inventory, cordoned) + "\n")
    if fmt != "json":
        return _bad_request(f"unknown format {fmt!r}; use json or text")
    return web.json_response(graph_json(state.node_name, state.topology, state.ledger, state.inventory, cordoned))


async def _usage(request: web.Request) -> web.Response:
    reader = request.app[READER]
    try:
        snap = await _in_thread(request, reader.snapshot)
    except Exception as e:
        log.exception("usage snapshot failed")
        return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=500)
    return web.json_response(usage_json(snap))


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _readyz(request: web.Request) -> web.Response:
    try:
        ready = bool(request.app[READY]())
    except Exception as e:
        return web.json_response({"ready": False, "error": str(e)}, status=503)
    return web.json_response({"ready": ready}, status=200 if ready else 503)


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


async def _shutdown_executor(app: web.Application) -> None:
    app[EXECUTOR].shutdown(wait=False, cancel_futures=True)


@dataclass
class MetricsServer:
    runner: web.AppRunner
    host: str
    port: int  # the bound port (the real one when 0 was asked)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()
