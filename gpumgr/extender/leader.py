"""One active extender among several replicas: leader election over a `coordination.k8s.io/v1` Lease.

The way client-go's `leaderelection` (kube-scheduler's) does it:
- a candidate takes the Lease when it is absent, released (no holder), held by itself, or when the Lease's
  record has not changed for its `leaseDurationSeconds` as measured on the candidate's OWN clock (CLOCK_BOOTTIME)
  (other hosts' clocks are never compared with ours); every write is a PUT carrying the resourceVersion just
  read, so of two candidates only one wins (the other gets 409 Conflict);
- the leader renews every retry period; when it has not renewed for the renew deadline it stops leading at
  once, and when it sees another holder it stops at once;
- before each API write of a bind the leader checks that its last successful renewal was *sent* less than the
  renew deadline ago (`refusal()`): a process paused past its lease (SIGSTOP, a long GC, a frozen VM) and
  resumed finds its renewal too old and refuses, before it has even learnt that another replica leads.
  The margin between the renew deadline and the lease duration covers the latency of that write;
- a new leader serves only once `on_elected` (a fresh list of pods and nodes) has finished, so the binds the
  old leader made are in its view;
- `release()` (on SIGTERM) hands the Lease back (no holder) so a standby takes over without waiting;
- a leader whose view cannot be made current within twice the lease duration releases the Lease and sits out
  one lease duration, so that a standby that can list takes over;
- a Lease record is another process's word: a holder's `leaseDurationSeconds` counts for at most
  MAX_RECORD_DURATION seconds, a record that cannot be read (a `spec` that is not an object, ...) counts as
  expired and is overwritten (with the resourceVersion just read), and its holder's name is shown cut and quoted.

Times are measured on CLOCK_BOOTTIME (Linux), which keeps counting while the host is suspended, unlike
CLOCK_MONOTONIC: a leader whose host slept past its renew deadline refuses to bind when it wakes up.
Nothing stops the loop: an unexpected error in one step is logged (one line, at most every
ERROR_LOG_INTERVAL seconds) and the next step runs; if the loop ends anyway, `failure()` says so and
`/healthz` answers 500, so the kubelet restarts the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpumgr.extender.kubeaccess import ApiCallError

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "gpumgr-extender"
DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0
MAX_LEASE_DURATION = 3600.0
MIN_RETRY_PERIOD = 0.05
MAX_RECORD_DURATION = 300  # seconds: the longest leaseDurationSeconds of another holder a standby waits out
MAX_SHOWN_HOLDER = 253  # characters of another holder's identity shown in answers and logs
ERROR_LOG_INTERVAL = 10.0
SYNC_LIMIT_FACTOR = 2  # a new leader's view must be current within this many lease durations
MIN_RENEW_MARGIN = 1.0  # seconds between the renew deadline and the lease duration, for the last write's latency
RETRY_FACTOR = 1.2  # the renew deadline is at least this many retry periods
JITTER = 1.2  # a standby retries after retry period x [1, JITTER), so candidates do not march in step


@dataclass(frozen=True)
class ElectionSettings:
    identity: str
    namespace: str
    lease_name: str = DEFAULT_LEASE_NAME
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD

    def __post_init__(self) -> None:
        problem = settings_problem(self.lease_duration, self.renew_deadline, self.retry_period)
        if problem:
            raise ValueError(problem)
        if not self.identity or not self.namespace or not self.lease_name:
            raise ValueError("the identity, namespace and lease name of the election must not be empty")

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.lease_name}"


def settings_problem(duration: float, renew: float, retry: float) -> str:
    """Why these timings cannot work (one line, in terms of the flags), or ""."""
    if not (1 <= duration <= MAX_LEASE_DURATION and duration == int(duration)):
        return (f"--leader-elect-lease-duration {duration:g}: expected whole seconds from 1 to "
                f"{MAX_LEASE_DURATION:.0f} (the Lease stores whole seconds)")
    if not 0 < renew <= duration - MIN_RENEW_MARGIN:
        return (f"--leader-elect-renew-deadline {renew:g}: must be more than 0 and at least "
                f"{MIN_RENEW_MARGIN:g}s less than --leader-elect-lease-duration ({duration:g})")
    if not (retry >= MIN_RETRY_PERIOD and renew >= RETRY_FACTOR * retry):
        return (f"--leader-elect-retry-period {retry:g}: must be at least {MIN_RETRY_PERIOD:g}, and "
                f"--leader-elect-renew-deadline ({renew:g}) at least {RETRY_FACTOR:g} times it")
    return ""


class LeaseApi(Protocol):
    """The three Lease calls (`podcalls.PodCalls` has them); failures raise `ApiCallError`."""

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME (counts through suspend); CLOCK_MONOTONIC where there is none (not Linux)."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock_id) if clock_id is not None else time.monotonic()


def shown(holder: str) -> str:
    """Another process's identity as it may appear in an answer or a log line: cut and quoted."""
    return repr(holder[:MAX_SHOWN_HOLDER])


Term = tuple[int, int, str]  # (times this replica became leader, the Lease's leaseTransitions, its acquireTime)


def micro_time() -> str:
    """Now as a Kubernetes MicroTime (what `renewTime` and `acquireTime` hold)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(self, settings: ElectionSettings, api: LeaseApi, *,
                 on_elected: Callable[[], Awaitable[None]] | None = None,
                 on_stopped: Callable[[], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = boottime, wall: Callable[[], str] = micro_time):
        self.settings = settings
        self.api = api
        self.on_elected = on_elected  # a new leader makes its view current (and may then be routed to)
        self.on_stopped = on_stopped  # run (as a task) when this replica stops leading
        self.clock = clock
        self.wall = wall
        self.leading = False  # holds the Lease, as of its last renewal
        self.synced = False  # since it was elected, its view has been made current
        self.holder = ""  # the holder last observed in the Lease
        self.transitions = 0  # times this replica became the leader
        self._renewed_at = -math.inf  # `clock` time the last successful write was sent
        self._observed = ""  # the Lease's spec as last read, to tell when it changes
        self._observed_at = -math.inf  # `clock` time it was first seen as it is
        self._lease: dict[str, Any] | None = None  # the Lease as this replica last wrote it
        self._other = False  # the last attempt found the Lease validly held by another replica
        self._sync: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped: set[asyncio.Task[None]] = set()  # on_stopped tasks still running
        self.closing = False  # shutting down: never leads again
        self._failure = ""  # why the election loop ended unexpectedly
        self._term: Term = (0, 0, "")
        self._sit_out_until = -math.inf  # a leader that could not sync does not campaign before this
        self._error_logged_at = -math.inf

    # -- what the routes ask ---------------------------------------------------------------------------------
    def refusal(self) -> str:
        """Why this replica must not serve or bind now, or "" when it may (leading, synced, renewed in time)."""
        s = self.settings
        if self.closing:
            return f"this gpumgr extender replica ({s.identity}) is shutting down; try again"
        if not self.leading:
            other = self.holder and self.holder != s.identity
            leader = f"replica {shown(self.holder)} leads" if other else "no other replica is known to lead yet"
            return (f"this gpumgr extender replica ({s.identity}) is not the leader; {leader} "
                    f"(Lease {s.lease}); try again")
        if self.clock() - self._renewed_at >= s.renew_deadline:
            return (f"this gpumgr extender replica ({s.identity}) has not renewed its Lease {s.lease} within "
                    f"{s.renew_deadline:g}s; it stops leading")
        if not self.synced:
            return (f"this gpumgr extender replica ({s.identity}) has just become the leader and is listing "
                    "pods and nodes; try again shortly")
        return ""

    def check(self) -> tuple[str, Term]:
        """`refusal()` and the leadership term it is about: a bind's later writes require the same term, so a
        replica that stopped leading and led again meanwhile does not finish a bind begun in its old term."""
        return self.refusal(), self._term

    def failure(self) -> str:
        """Why the election loop is not running as it should ("" while it is, or before it starts)."""
        return self._failure

    # -- the loop --------------------------------------------------------------------------------------------
    def start(self) -> None:
        task = asyncio.get_running_loop().create_task(self.run(), name="gpumgr-extender-election")
        self._task = task
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._task is not task:  # stopped by stop(): expected
            return
        why = "it was cancelled" if task.cancelled() else f"{type(task.exception()).__name__}: {task.exception()}"
        self._failure = f"the leader election loop of Lease {self.settings.lease} ended: {why}"
        log.error("leader election: %s; /healthz answers 500 so that the container is restarted", self._failure)

    async def run(self) -> None:
        s = self.settings
        log.info("leader election: replica %s is a candidate for Lease %s (duration %gs, renew deadline %gs, "
                 "retry %gs)", s.identity, s.lease, s.lease_duration, s.renew_deadline, s.retry_period)
        try:
            while True:
                try:
                    await self.step()
                except Exception as e:  # noqa: BLE001 - one bad step must not end the election
                    self._error(f"leader election: a step failed: {type(e).__name__}: {e}")
                delay = s.retry_period if self.leading else s.retry_period * random.uniform(1.0, JITTER)
                await asyncio.sleep(delay)
        finally:
            self._stop_leading("the election stopped")

    async def step(self) -> None:
        """One attempt to acquire or renew, and what follows from it."""
        s = self.settings
        if self.closing or self.clock() < self._sit_out_until:
            return
        ok = await self._attempt_bounded()
        if ok:
            if not self.leading and not self.closing and self.clock() >= self._sit_out_until:
                self._start_leading()
        elif self.leading:
            if self._other:
                self._stop_leading(f"replica {shown(self.holder)} holds the Lease now")
            elif self.clock() - self._renewed_at >= s.renew_deadline:
                self._stop_leading(f"the Lease was not renewed within {s.renew_deadline:g}s")

    async def _attempt_bounded(self) -> bool:
        try:
            async with asyncio.timeout(self.settings.renew_deadline):
                return await self.attempt()
        except TimeoutError:
            log.warning("leader election: no answer about Lease %s within %gs", self.settings.lease,
                        self.settings.renew_deadline)
        except ApiCallError as e:
            log.warning("leader election: Lease %s: %s", self.settings.lease, e)
        except Exception as e:  # noqa: BLE001 - a record or an answer nobody expected: try again next period
            self._error(f"leader election: Lease {self.settings.lease}: {type(e).__name__}: {e}")
        self._other = False
        return False

    def _error(self, line: str) -> None:
        """One line, no traceback, at most every ERROR_LOG_INTERVAL seconds."""
        now = self.clock()
        if now - self._error_logged_at >= ERROR_LOG_INTERVAL:
            self._error_logged_at = now
            log.warning("%s", line[:1000])

    async def attempt(self) -> bool:
        """client-go's tryAcquireOrRenew: True when this replica holds the Lease, renewed by this call."""
        s = self.settings
        sent = self.clock()  # renewals count from when they were sent: the conservative end for a leader
        self._other = False
        try:
            current = await self.api.get_lease(s.namespace, s.lease_name)
        except ApiCallError as e:
            if e.status != 404:
                raise
            return await self._create(sent)
        meta = current.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not isinstance(version, str) or not version:
            raise ApiCallError(0, "the Lease read back has no resourceVersion; not writing it")
        spec = current.get("spec")
        if not isinstance(spec, dict):  # unreadable: counts as expired, overwritten below
            spec = {}
        raw = json.dumps(spec, sort_keys=True)
        if raw != self._observed:
            self._observed, self._observed_at = raw, self.clock()
        holder = spec.get("holderIdentity")
        holder = holder if isinstance(holder, str) else ""
        self.holder = holder
        if holder and holder != s.identity:
            duration = spec.get("leaseDurationSeconds")
            if not isinstance(duration, int) or isinstance(duration, bool) or duration <= 0:
                duration = int(s.lease_duration)
            duration = min(duration, MAX_RECORD_DURATION)
            if self._observed_at + duration > self.clock():
                self._other = True
                return False
        if self.closing or self.clock() < self._sit_out_until:  # released meanwhile (shutting down, or sitting out)
            return False
        now = self.wall()
        mine = holder == s.identity
        acquired = spec.get("acquireTime")
        new_spec = {
            "holderIdentity": s.identity,
            "leaseDurationSeconds": int(s.lease_duration),
            "acquireTime": acquired if mine and isinstance(acquired, str) and acquired else now,
            "renewTime": now,
            "leaseTransitions": _int(spec.get("leaseTransitions")) + (0 if mine else 1),
        }
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
            "name": s.lease_name, "namespace": s.namespace, "resourceVersion": version}, "spec": new_spec}
        try:
            written = await self.api.replace_lease(s.namespace, s.lease_name, body)
        except ApiCallError as e:
            if e.status == 409:  # another replica wrote first
                return False
            raise
        self._took(written, sent)
        return True

    async def _create(self, sent: float) -> bool:
        s = self.settings
        now = self.wall()
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": s.lease_name, "namespace": s.namespace},
                "spec": {"holderIdentity": s.identity, "leaseDurationSeconds": int(s.lease_duration),
                         "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
        try:
            created = await self.api.create_lease(s.namespace, body)
        except ApiCallError as e:
            if e.status == 409:  # another replica created it first
                return False
            raise
        self._took(created, sent)
        return True

    def _took(self, lease: dict[str, Any], sent: float) -> None:
        self._lease = lease
        self._renewed_at = sent
        self.holder = self.settings.identity
        self._observed = json.dumps(lease.get("spec") or {}, sort_keys=True)
        self._observed_at = self.clock()

    def _start_leading(self) -> None:
        s = self.settings
        self.leading = True
        self.synced = False
        self.transitions += 1
        spec = (self._lease or {}).get("spec")
        spec = spec if isinstance(spec, dict) else {}
        self._term = (self.transitions, _int(spec.get("leaseTransitions")), str(spec.get("acquireTime") or ""))
        log.info("leader election: replica %s became the leader (Lease %s); making its view current",
                 s.identity, s.lease)
        self._sync = asyncio.get_running_loop().create_task(self._make_current(), name="gpumgr-extender-resync")

    async def _make_current(self) -> None:
        s = self.settings
        began = self.clock()
        limit = SYNC_LIMIT_FACTOR * s.lease_duration
        try:
            async with asyncio.timeout(limit):
                while True:
                    try:
                        if self.on_elected is not None:
                            await self.on_elected()
                        break
                    except Exception as e:  # noqa: BLE001 - keep trying: a leader that cannot list serves nothing
                        self._error(f"leader election: making the view current failed: {type(e).__name__}: {e}; "
                                    "trying again")
                        await asyncio.sleep(s.retry_period)
        except TimeoutError:
            # Renewing while serving nothing would keep every standby out: hand the Lease over instead.
            self._sync = None
            self._sit_out_until = self.clock() + s.lease_duration
            self._stop_leading(f"its view could not be made current within {limit:g}s; it releases the Lease "
                               f"and does not campaign for {s.lease_duration:g}s")
            await self.release()
            return
        self.synced = True
        log.info("leader election: replica %s serves as the leader (view current in %.0f ms)",
                 self.settings.identity, (self.clock() - began) * 1000)

    def _stop_leading(self, why: str) -> None:
        if self._sync is not None:
            self._sync.cancel()
            self._sync = None
        was = self.leading
        if was:
            log.warning("leader election: replica %s stopped leading: %s", self.settings.identity, why)
        self.leading = False
        self.synced = False
        if was and self.on_stopped is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to run it on
                task = asyncio.get_running_loop().create_task(self._run_stopped(), name="gpumgr-extender-stepped")
                self._stopped.add(task)
                task.add_done_callback(self._stopped.discard)

    async def _run_stopped(self) -> None:
        assert self.on_stopped is not None
        try:
            async with asyncio.timeout(self.settings.renew_deadline):
                await self.on_stopped()
        except Exception as e:  # noqa: BLE001 - best effort: the next leader cleans up after it too
            log.warning("leader election: after stepping down: %s: %s", type(e).__name__, e)

    def step_down(self) -> None:
        """Stop serving and binding at once, for good (the Lease is kept until `stop`)."""
        self.closing = True
        self._stop_leading("shutting down")

    async def stop(self, release: bool = True) -> None:
        """Stop campaigning; with `release`, hand the Lease back when this replica last held it."""
        self.closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._stop_leading("shutting down")
        if self._stopped:
            await asyncio.wait(set(self._stopped))
        if release:
            await self.release()

    async def release(self) -> None:
        """client-go's ReleaseOnCancel: no holder, a one-second duration, so a standby takes over at once."""
        s = self.settings
        lease, self._lease = self._lease, None
        self.leading = self.synced = False
        if lease is None:
            return
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != s.identity:
            return
        now = self.wall()
        spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now})
        body = {**lease, "spec": spec}
        try:
            async with asyncio.timeout(s.renew_deadline):
                await self.api.replace_lease(s.namespace, s.lease_name, body)
            log.info("leader election: replica %s released Lease %s", s.identity, s.lease)
        except (ApiCallError, TimeoutError) as e:  # someone took it meanwhile, or the API is away: it expires
            log.warning("leader election: cannot release Lease %s: %s", s.lease, e)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
