"""The webhook's listening socket: TCP (optionally TLS) with a cap on open connections and a TLS handshake
timeout. Any pod can reach the webhook, and with failurePolicy Fail a webhook tied up by idle connections blocks
GPU pod creation; so a connection over the cap is answered `503` with a JSON error and closed at once. (The header
timeout is the runner's `keepalive_timeout`, see `server.py`.)"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

_BUSY_BODY = json.dumps({"error": "the gpumgr webhook has too many open connections; try again"}).encode()
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class LimitedSite(web.BaseSite):
    """A TCPSite that serves at most `max_connections` connections at once."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 handshake_timeout: float, ssl_context: ssl.SSLContext | None = None):
        super().__init__(runner, ssl_context=ssl_context)
        self.host, self.requested_port = host, port
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self.port = 0
        self.refused = 0  # connections answered 503 because of the cap

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) < self.max_connections:
                return server()
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("%d open connections (the cap, --max-connections): answering 503 (%d so far)",
                            len(server.connections), self.refused)
            return _Busy()

        kw: dict[str, Any] = {"ssl": self._ssl_context, "backlog": self._backlog, "reuse_address": True}
        if self._ssl_context is not None:
            kw["ssl_handshake_timeout"] = self.handshake_timeout
        self._server = await asyncio.get_running_loop().create_server(protocol, self.host, self.requested_port, **kw)
        self.port = int(self._server.sockets[0].getsockname()[1])


class _Busy(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_BUSY)
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass
