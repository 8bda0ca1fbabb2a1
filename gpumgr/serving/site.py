"""A listening socket for the HTTP services (extender, webhook): TCP, optionally TLS, with a cap on open
connections and a TLS handshake timeout. A connection over the cap is answered `503` with a JSON body and closed at
once, so callers cannot grow the process's memory or tie it up without bound (the header timeout is the runner's
`keepalive_timeout`, set by each service)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


class CappedSite(web.BaseSite):
    """A TCPSite that serves at most `max_connections` connections at once; over it, `busy_body` (JSON) with 503."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 handshake_timeout: float, busy_body: bytes, ssl_context: ssl.SSLContext | None = None):
        super().__init__(runner, ssl_context=ssl_context)
        self.host, self.requested_port = host, port
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self.busy = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(busy_body), busy_body))
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
            return _Busy(self.busy)

        kw: dict[str, Any] = {"ssl": self._ssl_context, "backlog": self._backlog, "reuse_address": True}
        if self._ssl_context is not None:
            kw["ssl_handshake_timeout"] = self.handshake_timeout
        self._server = await asyncio.get_running_loop().create_server(protocol, self.host, self.requested_port, **kw)
        self.port = int(self._server.sockets[0].getsockname()[1])


class _Busy(asyncio.Protocol):
    def __init__(self, answer: bytes):
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.answer)
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass
