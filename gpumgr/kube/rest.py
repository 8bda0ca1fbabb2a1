"""A small asyncio client for the Kubernetes REST API: JSON in, JSON dicts out, on the caller's event loop.

No model classes and no threads: answers are parsed with `json.loads` (in C) and handed over as dicts, which is
what the agent works with anyway; the `kubernetes` package is neither imported nor needed here.

Every call has a connect timeout and a read timeout (time without a byte from the server), so a black-holed API
server fails a call instead of hanging it. Failures are `ApiError` (the server answered with an error status) or
`aiohttp.ClientError` / `TimeoutError` (it did not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import threading
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpumgr.kube.kubeconfig import ClusterAccess
from gpumgr.kube.pace import ELEMENT_BYTES, MAX_EVENT_BYTES, MAX_PAGE_ELEMENTS, LineSplitter
from gpumgr.kube.watch_event import parse_event
from gpumgr.serving import jsonbound

log = logging.getLogger("gpumgr.kube")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 16 << 20  # one object (a pod, a node: at most ~1.5 MiB in etcd); list pages: max_bytes
MAX_ERROR_BYTES = 64 << 10  # a Status object
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an error status; `status` is the HTTP code (404, 409, 410 ...)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeRest:
    """Calls on the running event loop, over one aiohttp session made on that loop (a session belongs to one loop).

    A call from another loop (a sync caller running `asyncio.run` per call) replaces the session; calls still running
    on the old one keep it until they end. A session is closed on its own loop: by `aclose()`/`close()`, or when that
    loop shuts down (`asyncio.run`, `asyncio.Runner` and `loop.shutdown_asyncgens()` close the async generators still
    open on the loop, and the session is watched by one), or when that loop next runs after the session was replaced
    and let go. The session of a loop closed without that shutdown is released by the next call or close.

    The TLS context is given per call (`ClusterAccess.tls_context()`). aiohttp pools connections by it, so when
    the cluster's CA or the client certificate files change, new calls open new connections with the new files, a
    running watch goes on over its own, and idle connections made with the old files close after the keep-alive.
    """

    def __init__(self, access: ClusterAccess, connect_timeout: float = CONNECT_TIMEOUT_S,
                 read_timeout: float = READ_TIMEOUT_S):
        self.access = access
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        access.tls_context()  # unusable TLS settings fail here, not at the first call
        self._slot: _Slot | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def _here(self) -> _Slot:
        """The running loop's session (a new one when the loop changed). A call holds the slot until it ends: the
        guard of a session replaced meanwhile is finalized, and the session closed on its loop, only after that."""
        loop = asyncio.get_running_loop()
        old = self._slot
        if old is not None and old.loop is loop and not old.session.closed:
            return old
        new = self._slot = _Slot.open(loop)
        await new.start()
        if old is not None and old.loop.is_closed():
            await old.close()  # nothing else can: its loop ended without shutting down its async generators
        # a replaced session of a loop still alive is closed by that loop: when the loop shuts down, or the next
        # time it runs after the guard, no longer held by anyone, was finalized
        return new

    def _ssl(self) -> ssl.SSLContext | bool:
        return self.access.tls_context() or False

    def _headers(self, content_type: str | None, force_token: bool = False) -> dict[str, str]:
        h: dict[str, str] = {}
        token = self.access.bearer(force=force_token)
        if token:
            h["Authorization"] = f"Bearer {token}"
        if content_type:
            h["Content-Type"] = content_type
        return h

    def _timeout(self, read: float | None = None, total: float | None = None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total, sock_connect=self.connect_timeout,
                                     sock_read=read if read is not None else self.read_timeout)

    def url(self, path: str) -> str:
        return self.access.server.rstrip("/") + path

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = JSON, max_bytes: int | None = None) -> dict[str, Any]:
        """One call; the answer's JSON object, at most `max_bytes` (MAX_ANSWER_BYTES by default) and one JSON
        element per ELEMENT_BYTES, both checked before decoding. A 401 reads the token file again and tries
        once more (the token may have been rotated between our check and the server's)."""
        cap = MAX_ANSWER_BYTES if max_bytes is None else max_bytes
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        slot = await self._here()
        for attempt in (0, 1):
            async with slot.session.request(
                    method, self.url(path), params=params, data=data, allow_redirects=False, ssl=self._ssl(),
                    headers=self._headers(content_type if data is not None else None, force_token=attempt > 0),
                    timeout=self._timeout(total=self.connect_timeout + self.read_timeout * 2)) as resp:
                if resp.status == 401 and attempt == 0 and self.access.token_file:
                    continue
                if resp.status >= 400:
                    raise _error(resp.status, resp.reason, await _read_capped(resp, MAX_ERROR_BYTES, method, path))
                raw = await _read_capped(resp, cap, method, path)
                break
        try:
            doc = jsonbound.loads(raw, max_elements=min(MAX_PAGE_ELEMENTS, max(1024, cap // ELEMENT_BYTES)),
                                  max_depth=jsonbound.API_OBJECT_DEPTH, what="the answer") if raw else {}
        except jsonbound.JsonBoundsError as e:
            raise ApiError(resp.status, "BadResponse", f"{method} {path}: {e}") from None
        except ValueError:
            raise ApiError(resp.status, "BadResponse", f"{method} {path}: the answer is not JSON") from None
        if not isinstance(doc, dict):
            raise ApiError(resp.status, "BadResponse", f"{method} {path}: the answer is not a JSON object")
        return doc

    async def watch(self, path: str, params: Mapping[str, str],
                    read_timeout: float) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a `?watch=true` stream, one JSON object a line, until the server ends it. An ERROR event
        is yielded like any other: the caller decides (410 Expired means list again)."""
        q = {**params, "watch": "true"}
        slot = await self._here()
        async with slot.session.get(self.url(path), params=q, headers=self._headers(None), allow_redirects=False,
                                    ssl=self._ssl(), timeout=self._timeout(read=read_timeout)) as resp:
            if resp.status >= 400:
                raise _error(resp.status, resp.reason, await _read_capped(resp, MAX_ERROR_BYTES, "GET", path))
            lines = LineSplitter()
            async for chunk in resp.content.iter_any():
                for line in lines.feed(chunk):
                    yield _event(line)
                if lines.pending > MAX_EVENT_BYTES:
                    raise ApiError(resp.status, "BadResponse", f"watch {path}: an event over {MAX_EVENT_BYTES} bytes")
            for line in lines.rest():
                yield _event(line)

    async def aclose(self) -> None:
        """Close the session if it belongs to the running loop (calls still using it fail). The session of another
        loop that is still alive is left to that loop, which closes it when it shuts down."""
        slot = self._slot
        if slot is not None and (slot.loop is asyncio.get_running_loop() or slot.loop.is_closed()):
            self._slot = None
            await slot.close()

    def close(self) -> None:
        """For callers that cannot await: in a task when the session's loop is the running one; now, on that loop,
        when it is idle and was made in this thread. Otherwise the loop closes it when it shuts down."""
        slot = self._slot
        if slot is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and (running is slot.loop or slot.loop.is_closed()):
            self._slot = None
            task = running.create_task(slot.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        elif running is None and slot.loop.is_closed():
            self._slot = None
            asyncio.run(slot.close())  # only releases it: its connections went with its loop
        elif running is None and not slot.loop.is_running() and slot.thread == threading.get_ident():
            self._slot = None
            slot.loop.run_until_complete(slot.close())


@dataclass(eq=False)
class _Slot:
    """The session, the loop it belongs to (and the thread that made it), and its guard."""

    loop: asyncio.AbstractEventLoop
    thread: int
    session: aiohttp.ClientSession
    guard: AsyncGenerator[None, None]

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop) -> _Slot:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32),
                                        headers={"Accept": JSON, "User-Agent": "gpumgr-agent"}, auto_decompress=True)
        return cls(loop, threading.get_ident(), session, _closed_with_the_loop(session))

    async def start(self) -> None:
        """From now on the shutdown of the running loop closes the session (the guard's first step does not
        suspend: the slot is complete before any other call runs)."""
        await anext(self.guard)

    async def close(self) -> None:
        """Close the session: on its own loop, or anywhere once that loop is closed (then only a release: its
        connections went with the loop). Best effort: the session is dropped either way."""
        try:
            with contextlib.suppress(RuntimeError):  # "already running": the loop's shutdown is closing it now
                await self.guard.aclose()  # runs the guard's `finally`
            if not self.session.closed:
                await self.session.close()
        except Exception as e:  # noqa: BLE001 - see above
            log.debug("closing an API session failed: %s", e)


async def _closed_with_the_loop(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """Suspended for as long as the session lives. The loop that first ran it closes it when the loop shuts down,
    before the loop itself is closed, so that a session nobody closed still closes on its own loop."""
    try:
        yield
    finally:
        await session.close()


async def _read_capped(resp: aiohttp.ClientResponse, cap: int, method: str, path: str) -> bytes:
    """The body, refused past `cap` bytes: a proxy or server gone wrong must not fill the agent's memory."""
    size = resp.content_length
    if size is not None and size > cap:
        raise ApiError(resp.status, "BadResponse", f"{method} {path}: an answer of {size} bytes (at most {cap})")
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > cap:
            raise ApiError(resp.status, "BadResponse", f"{method} {path}: an answer over {cap} bytes")
    return bytes(buf)


def _event(line: bytes) -> dict[str, Any]:
    try:
        return parse_event(line)
    except ValueError as e:
        raise ApiError(200, "BadResponse", str(e)) from None


def _error(status: int, reason: str | None, raw: bytes) -> ApiError:
    """The server's Status object says why; keep its reason and message when it sent one."""
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {}
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return ApiError(status, str(doc.get("reason") or reason or ""), str(doc.get("message") or ""))
    return ApiError(status, reason or "", raw[:200].decode("utf-8", "replace"))


def status_error(obj: Mapping[str, Any]) -> ApiError:
    """An ERROR watch event's Status object as an ApiError (code 410 = the resourceVersion is too old)."""
    code = obj.get("code")
    return ApiError(code if isinstance(code, int) else 500, str(obj.get("reason") or "Error"),
                    str(obj.get("message") or ""))
