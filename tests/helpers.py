"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
TOPO_FILES = sorted((FIXTURES / "topo").glob("*.txt"))


def topo_path(prefix: str) -> Path:
    matches = [p for p in TOPO_FILES if p.name.startswith(prefix)]
    assert len(matches) == 1, f"fixture {prefix!r}: {matches}"
    return matches[0]


async def until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll `cond` on the running loop until it holds; fail the test past `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.02)
