"""Bounds every Kubernetes client of gpumgr applies to what an API server sends (the extender's watcher threads,
the agent's pod cache): a broken or hostile server must cost a bounded amount of memory and CPU, and say so.

- Lists are read in pages (`limit`), each page at most `MAX_PAGE_BYTES` and `MAX_PAGE_ELEMENTS` JSON elements
  (checked on the bytes before decoding, gpumgr.serving.jsonbound), the whole list at most a per-resource item count;
  a server that ignores `limit` and answers everything at once is cut off with an error naming the bound.
- A watch event is one line of at most `MAX_EVENT_BYTES`.
- Bookmarks (events that change nothing) are counted by `BookmarkPace`: a burst, then a few a second. A server
  sends one about a minute; an endless stream of them would otherwise keep a core busy decoding nothing. Past
  the pace the client ends the stream (dropping whatever the server has queued on it) and resumes from the last
  version after a growing pause.
- A watch that ends at once (410 Expired, or the stream closed right away) is opened again only after a growing
  pause (`Backoff`), never in a tight list-410-list loop.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

MAX_PAGE_BYTES = 32 << 20  # one list page of 500 objects: ~10 MiB for pods heavy with managedFields
MAX_PAGE_ELEMENTS = 1_000_000  # JSON keys/values per page (~100 MB decoded at most; 500 real pods are ~250,000)
PAGE_DEADLINE_S = 120.0  # one list page, start to end (a 32 MiB page at a slow 1 MB/s takes ~35 s)
MAX_EVENT_BYTES = 8 << 20  # one watch event: a pod is at most ~1.5 MiB in etcd
# JSON keys, values, objects and arrays an answer may hold: one per ELEMENT_BYTES of its bytes. Real API objects
# have about one per 40 bytes (500 pods of ~10 MiB are ~250,000), so 16 leaves them room to spare, while an answer
# of bare `0,0,0,...` (one per 2 bytes) is refused before it is decoded into millions of Python objects.
ELEMENT_BYTES = 16
MAX_EVENT_ELEMENTS = MAX_EVENT_BYTES // ELEMENT_BYTES  # one watch event, for both watchers (agent and extender)
BOOKMARK_BURST = 20
BOOKMARKS_PER_S = 2.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.2, 10.0
QUICK_WATCH_S = 1.0  # a watch that ends sooner than this (with nothing in it) counts as a failure to back off on


class ListTooLarge(ValueError):
    """A list answer beyond the bounds above; the message names the resource and the bound."""


def read_capped(resp: Any, cap: int, what: str, deadline_s: float | None = None) -> bytes:
    """The body of a urllib3 response (the `kubernetes` client's, `_preload_content=False`), at most `cap` bytes
    and within `deadline_s` (PAGE_DEADLINE_S by default: the client's read timeout is per read, so a server
    trickling a byte now and then would otherwise hold the call forever); past either the connection is dropped
    (the rest is never read) and ListTooLarge says why."""
    buf = bytearray()
    until = time.monotonic() + (PAGE_DEADLINE_S if deadline_s is None else deadline_s)
    try:
        for chunk in resp.stream(1 << 16):
            buf += chunk
            if len(buf) > cap:
                raise ListTooLarge(f"{what}: the API server's answer is over {cap} bytes; cut off (does it ignore "
                                   "`limit`?)")
            if time.monotonic() > until:
                raise ListTooLarge(f"{what}: the API server's answer did not arrive within "
                                   f"{PAGE_DEADLINE_S if deadline_s is None else deadline_s:g} s ({len(buf)} bytes "
                                   "so far); cut off")
    except BaseException:
        with contextlib.suppress(Exception):
            resp.close()  # mid-body: this connection must not carry another request
        raise
    resp.release_conn()
    return bytes(buf)


def page_count_cap(max_items: int, page: int) -> int:
    """How many pages a list may take: enough for `max_items`, plus room for short pages."""
    return max_items // max(1, page) + 100


@dataclass
class BookmarkPace:
    """A token bucket for the bookmarks of one watch stream: `allow(now)` is False once they come faster than
    `per_s` after a burst of `burst`; the client then ends the stream and resumes after a pause (Backoff), so the
    server's backlog is dropped with the connection (pacing by waiting instead would leave real events queued
    behind thousands of buffered bookmarks)."""

    burst: int = BOOKMARK_BURST
    per_s: float = BOOKMARKS_PER_S
    tokens: float = field(default=float(BOOKMARK_BURST))
    last: float | None = None

    def allow(self, now: float) -> bool:
        if self.last is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_s)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class Backoff:
    """Doubling pauses from BACKOFF_FIRST_S to BACKOFF_MAX_S; `reset()` after a watch that lasted."""

    first: float = BACKOFF_FIRST_S
    most: float = BACKOFF_MAX_S
    current: float = BACKOFF_FIRST_S

    def next(self) -> float:
        wait = self.current
        self.current = min(self.current * 2, self.most)
        return wait

    def reset(self) -> None:
        self.current = self.first


class LineSplitter:
    """The non-blank lines of a watch stream fed in chunks; `pending` is the size of the unfinished line, which the
    caller bounds (MAX_EVENT_BYTES) after each chunk, so a line past the bound is never buffered further. A long
    line is scanned for its newline once, however many chunks it comes in."""

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf
        searched = len(buf)  # bytes known to hold no newline
        buf += chunk
        lines: list[bytes] = []
        while (nl := buf.find(b"\n", searched)) >= 0:
            line = bytes(buf[:nl])
            del buf[:nl + 1]
            searched = 0
            if line.strip():
                lines.append(line)
        return lines

    def rest(self) -> list[bytes]:
        """The last line when the stream ended without a newline after it."""
        return [bytes(self._buf)] if self._buf.strip() else []
