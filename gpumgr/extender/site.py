"""The listening socket of the extender: TCP (optionally TLS) with a cap on open connections and a TLS
handshake timeout. A connection over the cap is answered `503` with a JSON `Error` and closed at once, so the
number of callers cannot grow the process's memory without bound."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s")
BUSY_BODY = b'{"Error":"the gpumgr extender has too many open connections; try again"}'


class CappedSite(web.BaseSite):
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
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None

        def factory() -> asyncio.BaseProtocol:
            if len(server.connections) >= self.max_connections:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning("%d open connections (the cap): refusing new ones (%d refused so far)",
                                len(server.connections), self.refused)
                return _Busy()
            return server()

        loop = asyncio.get_running_loop()
        kw: dict[str, Any] = {"ssl": self._ssl_context, "backlog": self._backlog, "reuse_address": True}
        if self._ssl_context is not None:
            kw["ssl_handshake_timeout"] = self.handshake_timeout
        self._server = await loop.create_server(factory, self.host, self.requested_port, **kw)
        self.port = int(self._server.sockets[0].getsockname()[1])


class _Busy(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(BUSY % (len(BUSY_BODY), BUSY_BODY))
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass
