"""One asyncio lock per key (a claim UID, a MIG slot), kept only while someone holds or waits for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class KeyedLocks:
    """`hold(key)`: one holder of `key` at a time. A key's lock is forgotten only when nobody holds or waits for
    it, so a queued waiter and a newcomer always share one lock, and the table never outgrows what is in flight."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> (lock, holders + waiters)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        """Keys held or waited for."""
        return len(self._locks)
