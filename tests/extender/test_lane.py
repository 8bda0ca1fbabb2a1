"""`SmallestFirst`: requests whose bodies are ready at the same time do their work smallest body first."""

from __future__ import annotations

import asyncio

from gpumgr.extender.lane import SmallestFirst


async def test_waiting_requests_take_their_turn_smallest_first() -> None:
    lane = SmallestFirst()
    order: list[int] = []

    async def work(size: int) -> None:
        async with lane.turn(size):
            order.append(size)
            await asyncio.sleep(0)  # the turn is held across an await: the others keep waiting

    await asyncio.gather(*(work(s) for s in (900_000, 300, 1_000_000, 70_000, 300)))

    assert order == [300, 300, 70_000, 900_000, 1_000_000]


async def test_a_cancelled_waiter_does_not_keep_the_turn() -> None:
    lane = SmallestFirst()
    order: list[str] = []
    release = asyncio.Event()

    async def holder() -> None:
        async with lane.turn(1):
            order.append("holder")
            await release.wait()

    async def waiter(name: str, size: int) -> None:
        async with lane.turn(size):
            order.append(name)

    h = asyncio.ensure_future(holder())
    await asyncio.sleep(0.01)
    doomed = asyncio.ensure_future(waiter("doomed", 2))
    later = asyncio.ensure_future(waiter("later", 3))
    await asyncio.sleep(0.01)
    doomed.cancel()
    release.set()
    await asyncio.gather(h, later, return_exceptions=True)

    assert order == ["holder", "later"]
