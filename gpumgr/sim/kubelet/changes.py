"""A change signal: state owners call `notify()`; observers wait until a predicate over that state holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

POLL_S = 0.05


class ChangeSignal:
    """Wakes every waiter on each `notify()`; safe to call from synchronous code in the event loop."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` is true; raise TimeoutError after `timeout` seconds. The predicate is also
        checked every POLL_S: callers often wait on state this signal does not own (the API, an agent's log)."""

        async def _until() -> None:
            while not predicate():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), POLL_S)

        await asyncio.wait_for(_until(), timeout)
