"""One request's CPU work at a time, the smallest body first.

A handler reads its body (I/O, concurrently with others), then takes its `turn` for the work that runs on the
event loop without awaiting: decoding, filtering, encoding the answer. When several are waiting, the one with
the smallest body goes next, so a scheduler's normal request (tens to a few hundred KB) is not queued behind
callers sending the largest bodies the limit allows; each of those waits its turn and holds it only for its
own, bounded, work.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SmallestFirst:
    def __init__(self) -> None:
        self._busy = False
        self._scheduled = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @asynccontextmanager
    async def turn(self, size: int) -> AsyncIterator[None]:
        await self._acquire(size)
        try:
            yield
        finally:
            self._busy = False
            self._schedule()

    async def _acquire(self, size: int) -> None:
        """Always queue, and let `_dispatch` choose on a later pass of the loop: by then every request that
        became ready on this pass has queued too, so the smallest of them is chosen, not the first."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (size, next(self._seq), fut))
        self._schedule()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # given the turn, then cancelled: pass it on
                self._busy = False
                self._schedule()
            raise

    def _schedule(self) -> None:
        if not self._busy and not self._scheduled and self._waiting:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        if self._busy:
            return
        while self._waiting:
            _size, _seq, fut = heapq.heappop(self._waiting)
            if not fut.done():
                self._busy = True
                fut.set_result(None)
                return
