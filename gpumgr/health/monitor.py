"""GPU health: watch the cards and mark them unhealthy, and healthy again, in the node state.

Two loops run side by side. One waits for the backend's health events (XID, ECC, lost, recovered) in a thread
of its own, since that call blocks, and applies each batch as soon as it arrives. The other reads every card's
status every `poll_interval_s` (temperature, still on the bus) and lets XID reasons expire. Each reason is set
and cleared on its own with `NodeState.set_reason`; a card is healthy when it has none, and a change of health
wakes the device plugins' ListAndWatch streams. The rules themselves are in `rules.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpumgr.devices.backend import Backend
from gpumgr.devices.types import GPUStatus, HealthEvent
from gpumgr.health.config import (
    CHECKS,
    DEFAULT_IGNORED_XIDS,
    ECC,
    LOST,
    TEMPERATURE,
    XID,
    HealthConfig,
    parse_checks,
    parse_xids,
)
from gpumgr.health.rules import ALL_CARDS, HealthRules, ReasonChange
from gpumgr.node.state import NodeState

__all__ = [
    "CHECKS", "DEFAULT_IGNORED_XIDS", "ECC", "LOST", "TEMPERATURE", "XID", "HealthConfig", "HealthMonitor",
    "parse_checks", "parse_xids",
]

log = logging.getLogger("gpumgr.health")

TransitionCallback = Callable[[int, bool, str], None]  # (card, healthy now, reason that flipped it)
XidCallback = Callable[[int, int], None]  # (card or -1 when unknown, XID)


class HealthMonitor:
    def __init__(
        self,
        backend: Backend,
        state: NodeState,
        config: HealthConfig | None = None,
        on_transition: TransitionCallback | None = None,
        on_xid: XidCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.backend = backend
        self.state = state
        self.config = config or HealthConfig()
        self.on_transition = on_transition
        self.on_xid = on_xid
        self.clock = clock
        self.rules = HealthRules(self.config, state.inventory.count)
        self._pass = asyncio.Lock()
        self._unreadable: set[int] = set()  # cards whose status read failed last time (logged once)
        self._pool: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._first_pass = asyncio.Event()

    # -- running --------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Watch until cancelled. Reads every card first, so health is known from the start."""
        log.info("health monitor: %d card(s), polling every %g s, ignoring XIDs %s, checks off: %s",
                 self.rules.card_count, self.config.poll_interval_s, sorted(self.config.ignored_xids),
                 ", ".join(sorted(self.config.disabled)) or "none")
        self._first_pass.clear()
        try:
            await self.check_now()
            self._first_pass.set()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._watch_events())
                tg.create_task(self._watch_status())
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                # The event thread returns within event_wait_s; wait for it so no call outlives the monitor.
                await asyncio.shield(asyncio.to_thread(pool.shutdown, True))

    async def start(self) -> None:
        """Run in the background (see `stop`); returns once every card has been read, so health is known."""
        if self._task is not None and not self._task.done():
            return
        task = self._task = asyncio.create_task(self.run(), name="gpumgr-health")
        ready = asyncio.create_task(self._first_pass.wait())
        try:
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if task.done():
            self._task = None
            task.result()  # raises what ended the run

    async def stop(self) -> None:
        """Stop the background run; returns within about `event_wait_s`."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def check_now(self) -> None:
        """Read every card's status and expire XID reasons now (the poll loop calls this every interval)."""
        async with self._pass:
            statuses = await asyncio.get_running_loop().run_in_executor(self._executor(), self._read_statuses)
            for status in statuses:
                await self._apply(self.rules.on_status(status))
            await self._apply(self.rules.on_tick(self.clock()))

    async def handle_events(self, events: list[HealthEvent]) -> None:
        """Apply a batch of events, in order (the event loop calls this with what the backend reports)."""
        unknown_card_lost = False
        for event in events:
            self._log_event(event)
            if event.kind == "xid":
                self._report_xid(event.index, event.code)
            if event.kind == "lost" and event.index == ALL_CARDS:
                unknown_card_lost = True
            await self._apply(self.rules.on_event(event, self.clock()))
        if unknown_card_lost and self.config.enabled(LOST):
            await self.check_now()  # find the card that is gone: its status says so

    # -- the two loops --------------------------------------------------------------------------------------
    async def _watch_events(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.config.event_wait_s
        failing = False
        while True:
            try:
                events = await loop.run_in_executor(self._executor(), self.backend.wait_events, wait)
            except Exception as e:  # a backend error must not end health checking
                if not failing:
                    log.error("health: cannot read GPU events: %s (retrying)", e)
                failing = True
                await asyncio.sleep(wait)
                continue
            if failing:
                log.info("health: reading GPU events again")
                failing = False
            if events:
                await self.handle_events(events)

    async def _watch_status(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            await self.check_now()

    def _executor(self) -> ThreadPoolExecutor:
        # Two threads of our own: one blocked in wait_events, one reading status; the default pool stays free.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpumgr-health")
        return self._pool

    def _read_statuses(self) -> list[GPUStatus]:
        """Blocking: every readable card's status. A card that cannot be read is logged once and skipped:
        it is not marked unhealthy (an NVML hiccup must not empty the node); a card that is gone reads as lost."""
        out = []
        for i in range(self.rules.card_count):
            try:
                out.append(self.backend.status(i))
            except Exception as e:
                if i not in self._unreadable:
                    log.warning("card %d: cannot read status: %s (health unchanged)", i, e)
                self._unreadable.add(i)
                continue
            if i in self._unreadable:
                log.info("card %d: status readable again", i)
                self._unreadable.discard(i)
        return out

    # -- applying -------------------------------------------------------------------------------------------
    async def _apply(self, changes: list[ReasonChange]) -> None:
        for c in changes:
            reasons = self.state.health_reasons.get(c.index)
            if reasons is None or (c.reason in reasons) == c.present:
                continue
            flipped = await self.state.set_reason(c.index, c.reason, c.present)
            left = sorted(self.state.health_reasons.get(c.index, ()))
            card = self._card_name(c.index)
            if flipped and c.present:
                log.warning("%s unhealthy: %s (%s)", card, c.reason, c.detail)
            elif flipped:
                log.info("%s healthy: %s cleared (%s)", card, c.reason, c.detail)
            else:
                verb = "added" if c.present else "cleared"
                log.info("%s still unhealthy: %s %s (%s); reasons now %s", card, c.reason, verb, c.detail,
                         ", ".join(left))
            if flipped and self.on_transition is not None:
                try:
                    self.on_transition(c.index, not c.present, c.reason)
                except Exception:
                    log.exception("health: transition callback failed for card %d", c.index)

    def _report_xid(self, index: int, xid: int) -> None:
        if self.on_xid is None:
            return
        try:
            self.on_xid(index, xid)
        except Exception:
            log.exception("health: XID callback failed for card %d", index)

    def _log_event(self, event: HealthEvent) -> None:
        card = "unknown card" if event.index == ALL_CARDS else self._card_name(event.index)
        if event.kind == "xid":
            kind = "critical" if self.rules.is_critical_xid(event.code) else "ignored"
            log.info("%s: XID %d (%s)%s", card, event.code, kind, f": {event.detail}" if event.detail else "")
        elif event.kind in ("ecc", "lost", "recovered"):
            log.info("%s: %s event%s", card, event.kind, f" ({event.detail})" if event.detail else "")
        else:
            log.warning("%s: unknown health event kind %r ignored", card, event.kind)
        if event.index != ALL_CARDS and not self.rules.targets(event.index):
            log.warning("health event for card %d, which this node does not have; ignored", event.index)

    def _card_name(self, index: int) -> str:
        gpus = self.state.inventory.gpus
        return f"card {index} ({gpus[index].uuid})" if 0 <= index < len(gpus) else f"card {index}"
