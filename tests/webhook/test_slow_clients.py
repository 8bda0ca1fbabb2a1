"""Callers that hold connections open (any pod can reach the webhook): a connection that does not finish its
headers in time is closed, and connections over the cap are answered 503 and closed, so the API server's own calls
still get through."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from gpumgr.webhook.server import TlsFiles, WebhookServer
from tests.webhook.conftest import Pair

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def plain() -> AsyncIterator[tuple[WebhookServer, int]]:
    server = WebhookServer("gpumgr-scheduler", None, header_timeout=0.3, max_connections=4)
    port = await server.start("127.0.0.1", 0)
    yield server, port
    await server.stop()


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sends before it closes the connection (fails if it is still open after `seconds`)."""
    return await asyncio.wait_for(reader.read(), seconds)


async def test_half_sent_headers_are_cut_off(plain: tuple[WebhookServer, int]) -> None:
    _, port = plain
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-")  # and then nothing more
    await writer.drain()
    assert await _closed_within(reader, 5) == b""
    writer.close()


async def test_a_silent_connection_is_cut_off(plain: tuple[WebhookServer, int]) -> None:
    _, port = plain
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await _closed_within(reader, 5) == b""
    writer.close()


async def test_a_tls_handshake_never_begun_is_cut_off(certs: Pair) -> None:
    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key)), header_timeout=0.3)
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # plain TCP: no ClientHello ever
        assert await _closed_within(reader, 5) == b""
        writer.close()
    finally:
        await server.stop()


async def test_connections_over_the_cap_get_503_and_the_rest_keep_working() -> None:
    # the held connections must outlive the test's steps: with the fixture's 0.3 s header timeout the server may
    # cut them (a loaded machine) before the fifth comes, which is then served instead of refused
    server = WebhookServer("gpumgr-scheduler", None, header_timeout=30, max_connections=4)
    port = await server.start("127.0.0.1", 0)
    try:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await _closed_within(reader, 5)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and "too many open connections" in json.loads(body)["error"]
        for _, w in held:
            w.close()

        async def healthz() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await writer.drain()
            try:
                return await _closed_within(reader, 5)
            finally:
                writer.close()

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        answer = await healthz()
        while not answer.startswith(b"HTTP/1.1 200") and loop.time() < deadline:  # the closes take a moment
            await asyncio.sleep(0.05)
            answer = await healthz()
        assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        await server.stop()


def test_bad_limits_are_refused() -> None:
    for kw in ({"header_timeout": 0}, {"max_connections": 0}, {"max_cards": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            WebhookServer("gpumgr-scheduler", None, **kw)  # type: ignore[arg-type]
