"""`?watch=true`: a chunked HTTP stream of JSON events, one per line, as the API server sends them.

Events narrowed by a selector follow the real server: an object that starts matching arrives as ADDED,
one that stops matching as DELETED. A resourceVersion older than the store's history gets a single ERROR
event carrying a 410 `Expired` Status, which the `kubernetes` client turns into `ApiException(410)`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpumgr.sim.kubeapi.errors import ApiError
from gpumgr.sim.kubeapi.objects import ResourceKind
from gpumgr.sim.kubeapi.selectors import ObjectFilter
from gpumgr.sim.kubeapi.store import KubeStore, WatchEvent

_POLL_SECONDS = 0.5  # how often an idle watch checks for a gone client or its deadline


async def stream_watch(request: web.Request, store: KubeStore, kind: ResourceKind, flt: ObjectFilter,
                       settings: WatchSettings) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

    def notify(event: WatchEvent | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    try:
        first, last_rv, token = store.subscribe(kind.plural, settings.since, notify)
    except ApiError as exc:
        await response.prepare(request)
        await _send(response, "ERROR", exc.status())
        await response.write_eof()
        return response
    settings.active.add(queue)
    try:
        await response.prepare(request)
        for event in first:
            await _send_filtered(response, event, flt)
        await _pump(request, response, queue, kind, flt, settings, last_rv)
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        store.unsubscribe(token)
        settings.active.discard(queue)
    return response


async def _pump(request: web.Request, response: web.StreamResponse, queue: asyncio.Queue[WatchEvent | None],
                kind: ResourceKind, flt: ObjectFilter, settings: WatchSettings, last_rv: int) -> None:
    deadline = time.monotonic() + settings.timeout if settings.timeout is not None else None
    last_sent = time.monotonic()
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return
        if request.transport is None or request.transport.is_closing():
            return
        if settings.bookmarks and now - last_sent >= settings.bookmark_interval:
            await _send(response, "BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version,
                                               "metadata": {"resourceVersion": str(last_rv)}})
            last_sent = now
        wait = _POLL_SECONDS
        if deadline is not None:
            wait = min(wait, deadline - now)
        if settings.bookmarks:
            wait = min(wait, max(settings.bookmark_interval - (now - last_sent), 0.0))
        try:
            event = await asyncio.wait_for(queue.get(), timeout=max(wait, 0.0))
        except TimeoutError:
            continue
        if event is None:  # the server is stopping
            return
        last_rv = event.rv
        if await _send_filtered(response, event, flt):
            last_sent = time.monotonic()


async def _send_filtered(response: web.StreamResponse, event: WatchEvent, flt: ObjectFilter) -> bool:
    visible = _as_seen_through(event, flt)
    if visible is None:
        return False
    await _send(response, visible, event.obj)
    return True


def _as_seen_through(event: WatchEvent, flt: ObjectFilter) -> str | None:
    """The event type a watcher with this filter sees, or None when it sees nothing."""
    now_matches = flt.matches(event.obj)
    if event.type != "MODIFIED":
        return event.type if now_matches else None
    was_matching = event.old is not None and flt.matches(event.old)
    if now_matches:
        return "MODIFIED" if was_matching else "ADDED"
    return "DELETED" if was_matching else None


async def _send(response: web.StreamResponse, event_type: str, obj: dict[str, Any]) -> None:
    line = json.dumps({"type": event_type, "object": obj}, separators=(",", ":")) + "\n"
    await response.write(line.encode())


@dataclass
class WatchSettings:
    """What one watch request asked for, and the server's set of live watch queues (to end them on stop)."""

    since: int | None
    timeout: float | None
    bookmarks: bool
    bookmark_interval: float
    active: set[asyncio.Queue[WatchEvent | None]] = field(default_factory=set)
