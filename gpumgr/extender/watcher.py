"""List + watch of one resource in a thread of its own, handing what it sees to the event loop.

The usual informer cycle: list (in pages), then watch from the list's resourceVersion, resuming after each
normal end of the stream; a 410 Gone (history compacted) or any error means a fresh list after a short backoff.
Objects are reduced in the thread (`transform`, None = not interesting) and delivered on the loop with
`loop.call_soon_threadsafe`, so the cluster view is only ever touched by the loop.

`relist()` (a new leader making its view current) ends the watch and lists again at once; what it returns
completes once that list has been handed to the loop.

With `optional=True` a 404 (the API server does not serve the resource, e.g. no resource.k8s.io/v1) or a 403
(the service account may not read it: the chart grants DRA rules only where DRA is on) is logged once, hands the
loop an empty list, and ends the watcher: no retries; a relist then completes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpumgr.extender.kubeaccess import ApiCallError, KubeAccess
from gpumgr.kube.pace import MAX_EVENT_BYTES, QUICK_WATCH_S, Backoff, BookmarkPace, LineSplitter, page_count_cap
from gpumgr.kube.watch_event import parse_event

log = logging.getLogger(__name__)

PAGE = 500
# Objects one list may hold (the raw items, before `transform`): Kubernetes supports 5,000 nodes and 150,000
# pods per cluster; the extender's calls name at most 20,000 nodes (wire.MAX_NODES).
MAX_ITEMS = {"nodes": 20_000, "pods": 300_000, "resourceclaims": 100_000}
DEFAULT_MAX_ITEMS = 100_000
WATCH_SECONDS = 300


class Watcher:
    def __init__(self, access: KubeAccess, resource: str, loop: asyncio.AbstractEventLoop,
                 transform: Callable[[dict[str, Any]], Any],
                 on_list: Callable[[list[Any]], None], on_event: Callable[[str, Any], None], *,
                 optional: bool = False):
        self.access = access
        self.resource = resource
        self._loop = loop
        self._transform = transform
        self._on_list = on_list
        self._on_event = on_event
        self._stop = threading.Event()
        self._wake = threading.Event()  # ends a backoff early: stop or relist
        self._relist = threading.Event()
        self._lock = threading.Lock()
        self._waiting: list[asyncio.Future[None]] = []  # relist() callers, completed after the next list
        self._resp: Any = None
        self._quick = Backoff()  # pauses after watches that end at once, across lists (a 410 loop)
        self.bookmark_floods = 0  # watches ended because bookmarks came too fast (gpumgr.kube.pace)
        self.optional = optional
        self.absent = False  # the API does not serve the resource: the watcher has ended
        self._thread = threading.Thread(target=self._run, name=f"gpumgr-extender-watch-{resource}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._end_stream()
        self._thread.join(timeout=timeout)

    def relist(self) -> asyncio.Future[None]:
        """List again now (on the loop); the future completes once the new list is in the view."""
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._lock:
            if self.absent:
                fut.set_result(None)
                return fut
            self._waiting.append(fut)
        self._relist.set()
        self._wake.set()
        self._end_stream()
        return fut

    def _end_stream(self) -> None:
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # a stream that may already be closed
                cut_stream(resp)

    # -- the thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff()  # pauses before listing again after a failure
        while not self._stop.is_set():
            try:
                rv = self._list()
                backoff.reset()
                self._watch(rv)
                if self._relist.is_set():
                    continue
            except ApiCallError as e:
                if self._stop.is_set():
                    return
                if e.status in (403, 404) and self.optional:
                    self._give_up(e)
                    return
                log.warning("watch %s: %s; listing again in %.1fs", self.resource, e, backoff.current)
            except Exception:  # noqa: BLE001 - keep the cache alive whatever one event did
                if self._stop.is_set():
                    return
                log.exception("watch %s failed; listing again in %.1fs", self.resource, backoff.current)
            self._wake.wait(backoff.next())
            self._wake.clear()

    def _give_up(self, e: ApiCallError) -> None:
        why = "does not serve" if e.status == 404 else "does not let this service account list"
        log.info("the API server %s %s (%s): not watched", why, self.resource, e)
        with self._lock:
            self.absent = True
            waiting, self._waiting = self._waiting, []
        self._post(self._on_list, [])
        if waiting:
            self._post(_complete, waiting)

    def _list(self) -> str:
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._relist.clear()
            if not self._stop.is_set():
                self._wake.clear()
        try:
            rv = self._list_all()
        except BaseException:
            with self._lock:
                self._waiting[:0] = waiting  # the next list completes them
            raise
        if waiting:
            self._post(_complete, waiting)
        return rv

    def _list_all(self) -> str:
        items: list[Any] = []
        cont: str | None = None
        first_rv = ""
        cap = MAX_ITEMS.get(self.resource, DEFAULT_MAX_ITEMS)
        seen = pages = 0
        while True:
            page = self.access.list_page(self.resource, PAGE, cont)
            pages += 1
            meta = page.get("metadata") or {}
            first_rv = first_rv or str(meta.get("resourceVersion") or "")
            got = page.get("items") or []
            seen += len(got) if isinstance(got, list) else 0
            if seen > cap:
                raise ApiCallError(0, f"the list of {self.resource} goes past {cap} objects ({seen} in {pages} "
                                      "pages): not read further (a cluster larger than gpumgr supports, or a broken "
                                      "API server)")
            if pages >= page_count_cap(cap, PAGE) and meta.get("continue"):
                raise ApiCallError(0, f"the list of {self.resource} did not end after {pages} pages ({seen} "
                                      "objects): not read further (a broken API server)")
            for obj in got if isinstance(got, list) else ():
                out = self._transform(obj)
                if out is not None:
                    items.append(out)
            cont = meta.get("continue")
            if not cont:
                break
        self._post(self._on_list, items)
        log.info("listed %d %s (resourceVersion %s)", len(items), self.resource, first_rv)
        return first_rv

    def _watch(self, rv: str) -> None:
        """Follow events from `rv` until the stop flag, a 410, or an error (raised). A watch that ends at once
        with nothing in it (410 again and again, a stream closed right away) is followed by a growing pause."""
        from urllib3.exceptions import HTTPError

        pace = BookmarkPace()
        backoff = self._quick
        while not self._stop.is_set() and not self._relist.is_set():
            opened, events = time.monotonic(), 0
            try:
                resp = self.access.open_watch(self.resource, rv, WATCH_SECONDS)
            except ApiCallError as e:
                if e.status == 410:
                    self._pause_if_quick(opened, 0, backoff)
                    return
                raise
            self._resp = resp
            ended = False  # the server ended the stream: the connection may carry the next request
            flooded = False  # bookmarks came too fast: the stream was cut, resume after a pause
            try:
                if self._stop.is_set() or self._relist.is_set():  # asked for while the watch was opening
                    return
                for line in event_lines(resp):
                    if self._stop.is_set() or self._relist.is_set():
                        return
                    event = _event(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            log.info("watch %s: resourceVersion %s expired; listing again", self.resource, rv)
                            self._pause_if_quick(opened, events, backoff)
                            return
                        raise ApiCallError(int(obj.get("code") or 0), str(obj.get("message") or obj))
                    events += 1
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        out = self._transform(obj)
                        if out is not None:
                            self._post(self._on_event, kind, out)
                    elif kind == "BOOKMARK" and not pace.allow(time.monotonic()):
                        log.warning("watch %s: the API server sends bookmarks faster than %g a second (after %d); "
                                    "ending this watch, resuming after %.1fs", self.resource, pace.per_s,
                                    pace.burst, backoff.current)
                        self.bookmark_floods += 1
                        flooded = True
                        break  # cut: the connection is dropped with whatever the server queued on it
                else:
                    ended = True
                    self._pause_if_quick(opened, events, backoff)
            except (OSError, ValueError, HTTPError) as e:
                if self._stop.is_set() or self._relist.is_set():
                    return
                raise ApiCallError(0, f"watch stream broke: {e}") from None
            finally:
                self._resp = None
                if not ended:
                    # Cut mid-stream: the server is still sending on this connection, so it must not go back
                    # to the pool (the next list would read the watch's chunks as its answer).
                    with contextlib.suppress(Exception):
                        resp.close()
                resp.release_conn()
            if flooded:
                self._wake.wait(backoff.next())  # after the connection is gone; stop and relist end it early

    def _pause_if_quick(self, opened: float, events: int, backoff: Backoff) -> None:
        if events == 0 and time.monotonic() - opened < QUICK_WATCH_S:
            self._wake.wait(backoff.next())
        else:
            backoff.reset()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop.is_closed():
            self._stop.set()
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: we are shutting down
            self._stop.set()


def event_lines(resp: Any) -> Iterator[bytes]:
    """The non-blank lines of a watch stream (a urllib3 response), each at most MAX_EVENT_BYTES (ApiCallError past
    it: the rest of such a line is never buffered)."""
    lines = LineSplitter()
    for chunk in resp.stream(1 << 16):
        yield from lines.feed(chunk)
        if lines.pending > MAX_EVENT_BYTES:
            raise ApiCallError(0, f"a watch event over {MAX_EVENT_BYTES} bytes: the stream is cut off")
    yield from lines.rest()


def _event(line: bytes) -> dict[str, Any]:
    try:
        return parse_event(line)
    except ValueError as e:
        raise ApiCallError(0, str(e)) from None


def cut_stream(resp: Any) -> None:
    """Wake the thread blocked reading `resp` (a urllib3 HTTPResponse), from another thread: its socket is shut
    down, so the read ends at once. urllib3 >= 2.3 has `shutdown()` for this; older ones (kubernetes >= 30 allows
    them) have the socket on the response's connection."""
    shutdown = getattr(resp, "shutdown", None)
    if callable(shutdown):
        shutdown()
        return
    conn = getattr(resp, "_connection", None) or getattr(resp, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        raise RuntimeError("the watch stream's socket is not reachable; it ends at its timeout")
    sock.shutdown(socket.SHUT_RDWR)


def _complete(waiting: list[asyncio.Future[None]]) -> None:
    for fut in waiting:
        if not fut.done():
            fut.set_result(None)
