"""The API test server served by a test: plain HTTP or TLS (optionally requiring client certificates), with
middlewares a test adds to shape what the "cluster" answers (conflicts, expired versions, bearer tokens)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from gpumgr.sim.kubeapi import KubeStore
from gpumgr.sim.kubeapi.routes import build_app
from tests.extender.certs import Certs, make_certs

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


@dataclass
class Cluster:
    store: KubeStore
    url: str
    seen: list[web.Request] = field(default_factory=list)

    def kubeconfig(self, path: Path, cluster: dict[str, object] | None = None,
                   user: dict[str, object] | None = None) -> Path:
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": self.url, **(cluster or {})}}],
            "users": [{"name": "u", "user": user or {}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
        return path


class ClusterFactory:
    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []

    async def __call__(self, *middlewares: Middleware, tls: ssl.SSLContext | None = None,
                       store: KubeStore | None = None) -> Cluster:
        store = store or KubeStore()
        app = build_app(store, bookmark_interval=0.3)
        seen: list[web.Request] = []

        @web.middleware
        async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
            seen.append(request)
            return await handler(request)

        for m in (*(web.middleware(m) for m in reversed(middlewares)), record):
            app.middlewares.insert(0, m)  # outside the server's own error handling; `record` sees every request
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        self.runners.append(runner)
        port = runner.addresses[0][1]
        return Cluster(store, f"{'https' if tls else 'http'}://127.0.0.1:{port}", seen)


@pytest.fixture
async def cluster() -> AsyncIterator[ClusterFactory]:
    f = ClusterFactory()
    yield f
    for r in f.runners:
        await r.cleanup()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


def server_tls(certs: Certs, client_certs: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certs.server_crt), str(certs.server_key))
    if client_certs:
        ctx.load_verify_locations(str(certs.ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
