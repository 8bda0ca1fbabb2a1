"""`WebhookServer`: `/mutate` and `/healthz` over HTTPS (aiohttp).

    server = WebhookServer("gpumgr-scheduler", tls=TlsFiles(cert, key))   # tls=None: plain HTTP (tests, demo)
    port = await server.start("127.0.0.1", 0)                          # 0: any free port
    ...
    await server.stop()

Every error is JSON (`{"error": "..."}`): 400 for a body that is not an AdmissionReview v1, 413 over the size
limit (after gzip/deflate decompression), 408 when the body is not sent in time, 415 for another
Content-Encoding, 404/405 for wrong paths and methods, 503 when `max_connections` are already open or too many
bodies are being read at once (bodies are read by `gpumgr.serving.body.read_body`, as the extender's are).
A connection that has not sent a whole request head within `header_timeout` seconds (or sits
idle that long between requests) is closed. The certificate and key are read again when their files change
(cert-manager rotates them), checked every `reload_every` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpumgr.serving.body import BodyBudget, BodyError, ClientGone, Limits, read_body
from gpumgr.webhook.policy import MAX_CARDS, review_pod
from gpumgr.webhook.review import BadReview, decode, parse_review, response

BUSY_BODY = b'{"error":"the gpumgr webhook has too many open connections; try again"}'
log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024  # a Pod is at most ~1.5 MiB in etcd; object and oldObject together fit
# A body may hold one JSON key, value, object or array per this many of its bytes (the extender's is serving.body's
# JSON_BYTES_PER_ELEMENT): 200,000 in 4 MiB, ten times what a pod with 10,000 environment variables and its
# managedFields holds; ~20 MiB of Python objects at most
# (gpumgr.serving.jsonbound.BYTES_PER_ELEMENT), where 4 MiB of `{},` unchecked were 1.3 million dicts and ~190 MiB.
JSON_BYTES_PER_ELEMENT = 20
READ_TIMEOUT = 10.0  # the API server's own webhook timeout is 10 s by default
HEADER_TIMEOUT = 5.0  # to send the request line and headers (and the TLS handshake); also the idle keep-alive
MAX_CONNECTIONS = 256
RELOAD_EVERY = 60.0
PROBE_CONNECTIONS = 16  # the probe port serves the kubelet's probes only


class WebhookServer:
    def __init__(self, scheduler_name: str, tls: TlsFiles | None, *, max_body_bytes: int = MAX_BODY_BYTES,
                 read_timeout: float = READ_TIMEOUT, reload_every: float = RELOAD_EVERY,
                 header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 max_cards: int = MAX_CARDS, memory_limit_bytes: int = 0, probe: tuple[str, int] | None = None):
        for name, value in (("header_timeout", header_timeout), ("max_connections", max_connections),
                            ("max_cards", max_cards), ("read_timeout", read_timeout)):
            if not value > 0:
                raise ValueError(f"{name} must be greater than 0, got {value}")
        self.scheduler_name = scheduler_name
        self.tls = tls
        self.max_body_bytes = max_body_bytes
        self.read_timeout = read_timeout
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.max_cards = max_cards
        self.reload_every = reload_every
        self.ssl_context: ssl.SSLContext | None = server_context(tls) if tls else None
        # bodies are read by gpumgr.serving.body, as the extender's are (size after decompression, time, shared budget)
        # and, with the container's memory limit, the bodies in flight fit in 3/8 of it (serving.body.Limits)
        self._limits = Limits(max_body_bytes=max_body_bytes, header_timeout=header_timeout, body_timeout=read_timeout,
                              max_connections=max_connections, memory_limit_bytes=memory_limit_bytes,
                              json_bytes_per_element=JSON_BYTES_PER_ELEMENT)
        self.max_elements = self._limits.max_json_elements
        self._budget = BodyBudget(self._limits.budget_bytes)
        self._stamp = _stamp(tls) if tls else None
        self.probe = probe  # (host, port): /healthz alone on plain HTTP, for kubelet probes (no client certificate)
        self.probe_port: int | None = None
        self._runner: Any = None
        self._probe_runner: Any = None
        self._reloader: asyncio.Task[None] | None = None

    async def start(self, host: str = "0.0.0.0", port: int = 8443) -> int:
        """Listen (and on the probe address, if any); returns the port listened on."""
        from aiohttp import web

        if self._runner is not None:
            raise RuntimeError("the webhook is already started")
        app = web.Application(middlewares=[_json_errors()])
        app.router.add_post("/mutate", self._mutate)
        app.router.add_get("/healthz", self._healthz)
        runner, bound = await self._listen(app, host, port, self.max_connections, self.ssl_context)
        if self.probe is not None:
            probe_app = web.Application(middlewares=[_json_errors()])
            probe_app.router.add_get("/healthz", self._healthz)
            try:
                self._probe_runner, self.probe_port = await self._listen(probe_app, *self.probe, PROBE_CONNECTIONS,
                                                                         None)
            except BaseException:
                await runner.cleanup()
                raise
        self._runner = runner
        if self.tls is not None and self.reload_every > 0:
            self._reloader = asyncio.ensure_future(self._reload_loop())
        auth = "client certificates required" if self.tls and self.tls.client_ca_file else "no client authentication"
        log.info("webhook listening on %s://%s:%d (schedulerName %s; %s)", "https" if self.tls else "http", host,
                 bound, self.scheduler_name, auth)
        if self.probe_port is not None:
            log.info("health probe on http://%s:%d/healthz", self.probe[0] if self.probe else "", self.probe_port)
        return bound

    async def _listen(self, app: Any, host: str, port: int, max_connections: int,
                      ssl_context: ssl.SSLContext | None) -> tuple[Any, int]:
        """A runner for `app` serving on host:port (CappedSite, as the extender's); the runner and the bound port."""
        from aiohttp import web

        from gpumgr.serving.site import CappedSite

        # keepalive_timeout is aiohttp's timer from a connection's start (or its last answer) to a whole request
        # head: a caller that sends part of its headers and stops is closed after it
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=self.header_timeout,
                               lingering_time=1.0, auto_decompress=False)  # read_body inflates, bounded
        await runner.setup()
        try:
            site = CappedSite(runner, host, port, max_connections=max_connections,
                              handshake_timeout=self.header_timeout, ssl_context=ssl_context, busy_body=BUSY_BODY)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner, int(site.port)

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
            self._reloader = None
        for attr in ("_runner", "_probe_runner"):
            runner = getattr(self, attr)
            setattr(self, attr, None)
            if runner is not None:
                await runner.cleanup()
        self.probe_port = None

    def reload_certificates(self) -> bool:
        """Load the certificate and key again if their files changed; True when the new pair is in use.
        A pair that does not load is logged and the old one kept."""
        if self.tls is None or self.ssl_context is None:
            return False
        stamp = _stamp(self.tls)
        if stamp == self._stamp:
            return False
        try:
            self.ssl_context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        except (OSError, ssl.SSLError) as e:
            log.error("cannot reload %s / %s, keeping the certificate in use: %s", self.tls.cert_file,
                      self.tls.key_file, e)
            return False
        self._stamp = stamp
        log.info("reloaded the TLS certificate from %s", self.tls.cert_file)
        return True

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reload_every)
            self.reload_certificates()

    async def _mutate(self, request: Any) -> Any:
        raw = await read_body(request, self._limits, self._budget, service="gpumgr webhook", limit_flag="")
        review = parse_review(decode(raw, self.max_elements))
        if not review.is_pod or review.obj is None:
            return _reply(response(review.uid))
        verdict = review_pod(review.obj, review.operation, self.scheduler_name, max_cards=self.max_cards,
                             old=review.old)
        name = _pod_name(review.obj, review.namespace)
        if verdict.denied:
            log.info("refused pod %s: %s", name, verdict.denied)
        elif verdict.patch:
            log.info("pod %s: schedulerName set to %s", name, self.scheduler_name)
        return _reply(response(review.uid, patch=verdict.patch, denied=verdict.denied, warnings=verdict.warnings))

    async def _healthz(self, _request: Any) -> Any:
        return _reply({"status": "alive"})


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    """TLS 1.2+ server context (the extender's, `gpumgr.serving.tls`); with a client CA, callers must present a
    certificate it signed. Raises TlsSettingsError (a ValueError naming the flag and file) when a file cannot
    be used."""
    from gpumgr.serving.tls import server_context as context

    return context(tls.cert_file, tls.key_file, tls.client_ca_file)


def _stamp(tls: TlsFiles) -> tuple[tuple[int, int], ...]:
    out = []
    for path in (tls.cert_file, tls.key_file):
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, 0))
    return tuple(out)


def _reply(body: Any, status: int = 200) -> Any:
    from aiohttp import web

    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


def _json_errors() -> Any:
    from aiohttp import web

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadReview as e:
            log.info("%s %s: 400: %s", request.method, request.path, e)
            return _reply({"error": str(e)}, 400)
        except (BodyError, ClientGone) as e:
            status = e.status if isinstance(e, BodyError) else 400
            log.info("%s %s from %s: %d: %s", request.method, request.path, request.remote, status, e)
            resp = _reply({"error": str(e)}, status)
            if not isinstance(e, BodyError) or e.close:
                resp.force_close()  # the rest of the body is unread: the connection cannot carry another request
            return resp
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return _reply({"error": e.reason}, e.status)
        except Exception as e:  # noqa: BLE001 - a bug must not become a traceback to the API server
            log.exception("%s %s failed", request.method, request.path)
            return _reply({"error": f"internal error in the gpumgr webhook: {type(e).__name__}"}, 500)

    return middleware


def _pod_name(pod: dict[str, Any], namespace: str) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = meta.get("name") or meta.get("generateName") or "?"
    return f"{namespace or meta.get('namespace') or 'default'}/{str(name)[:253]}"


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    client_ca_file: str = ""  # when set, callers must present a certificate signed by this CA
