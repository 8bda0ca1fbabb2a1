"""Leader election (`gpumgr.extender.leader.Elector`) against the test API server, step by step, on a clock the
test moves: who takes the Lease and when, renewals, the renew deadline, release, and 409 races."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpumgr.extender.kubeaccess import ApiCallError
from gpumgr.extender.leader import ElectionSettings, Elector, settings_problem
from gpumgr.extender.podcalls import PodCalls
from gpumgr.sim.kubeapi import KubeApiServer

NS = "gpu-system"
LEASE = "gpumgr-extender"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Flaky:
    """A LeaseApi that fails every call while `down`, and can hold each get until released (races)."""

    def __init__(self, api: PodCalls):
        self.api = api
        self.down = False
        self.gate: asyncio.Event | None = None
        self.arrived = 0

    async def _check(self) -> None:
        if self.down:
            raise ApiCallError(0, "ConnectionRefusedError: the API is away")

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        await self._check()
        got = await self.api.get_lease(namespace, name)
        self.arrived += 1
        if self.gate is not None:
            await self.gate.wait()
        return got

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._check()
        return await self.api.create_lease(namespace, body)

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._check()
        return await self.api.replace_lease(namespace, name, body)


Make = Callable[..., Elector]


async def settle(elector: Elector) -> None:
    """Let the new leader's view sync (its on_elected) run; fails when it does not finish."""
    for _ in range(500):
        if elector.synced or not elector.leading:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the view of {elector.settings.identity} was not made current: {elector.refusal()}")


def lease(api: KubeApiServer) -> dict[str, Any]:
    got = api.store.get_object("leases", LEASE, NS)
    assert got is not None
    return got["spec"]


async def test_the_first_candidate_leads_and_the_second_waits(api: KubeApiServer, make: Make) -> None:
    clock = Clock()
    a, b = make("a", clock), make("b", clock)
    await a.step()
    await settle(a)
    assert a.leading and a.refusal() == ""
    assert lease(api)["holderIdentity"] == "a" and lease(api)["leaseTransitions"] == 0
    await b.step()
    assert not b.leading
    assert "not the leader; replica 'a' leads" in b.refusal()
    # the leader renews; the standby, seeing the Lease change, keeps waiting
    for _ in range(10):
        clock.now += 2
        await a.step()
        await b.step()
    assert a.leading and not b.leading and lease(api)["holderIdentity"] == "a"


async def test_a_standby_takes_over_after_the_lease_duration_on_its_own_clock(api: KubeApiServer,
                                                                               make: Make) -> None:
    clock_a, clock_b = Clock(), Clock()
    a, b = make("a", clock_a), make("b", clock_b)
    await a.step()
    await settle(a)
    # the Lease's renewTime says "long ago" by the wall clock: the standby does not care, only about change
    api.store.merge_patch_object("leases", LEASE, {"spec": {"renewTime": "2000-01-01T00:00:00.000000Z"}}, NS)
    await b.step()
    clock_b.now += 14.9
    await b.step()
    assert not b.leading  # 14.9 s unchanged on b's clock: not yet
    clock_b.now += 0.2
    await b.step()
    await settle(b)
    assert b.leading and b.refusal() == ""
    assert lease(api)["holderIdentity"] == "b" and lease(api)["leaseTransitions"] == 1
    # the old leader, whose clock did not move (paused), refuses to bind before it learns anything ...
    clock_a.now += 10
    assert "has not renewed its Lease" in a.refusal()
    # ... and its next attempt sees the new holder: it stops leading at once
    await a.step()
    assert not a.leading and "replica 'b' leads" in a.refusal()


async def test_a_leader_that_cannot_renew_stops_at_the_renew_deadline(api: KubeApiServer, calls: PodCalls,
                                                                       make: Make) -> None:
    clock = Clock()
    flaky = Flaky(calls)
    a = make("a", clock, flaky)
    await a.step()
    await settle(a)
    flaky.down = True
    clock.now += 2
    await a.step()
    assert a.leading and a.refusal() == ""  # one failed renewal: still within the deadline
    clock.now += 7.9
    await a.step()
    assert a.leading
    clock.now += 0.2  # 10.1 s since the last renewal was sent
    assert "has not renewed" in a.refusal()
    await a.step()
    assert not a.leading
    # the API comes back: the Lease is still its own, so it leads again (and syncs its view again)
    flaky.down = False
    await a.step()
    assert a.leading and a.transitions == 2


async def test_two_candidates_racing_for_an_expired_lease_one_wins(api: KubeApiServer, calls: PodCalls,
                                                                    make: Make) -> None:
    clock = Clock()
    a = make("a", clock)
    await a.step()
    await settle(a)
    flaky = Flaky(calls)
    b, c = make("b", clock, flaky), make("c", clock, flaky)
    await b.step()
    await c.step()
    clock.now += 16  # a is gone: both see the Lease unchanged for longer than its duration
    flaky.gate = asyncio.Event()
    flaky.arrived = 0
    race = asyncio.gather(b.attempt(), c.attempt())
    while flaky.arrived < 2:  # both have read the same resourceVersion
        await asyncio.sleep(0.01)
    flaky.gate.set()
    won = await race
    assert sorted(won) == [False, True]
    winner = "b" if won[0] else "c"
    assert lease(api)["holderIdentity"] == winner and lease(api)["leaseTransitions"] == 1


async def test_release_hands_the_lease_over_at_once(api: KubeApiServer, make: Make) -> None:
    clock = Clock()
    a, b = make("a", clock), make("b", clock)
    await a.step()
    await settle(a)
    await b.step()
    a.start()
    await a.stop(release=True)
    assert not a.leading and lease(api)["holderIdentity"] == ""
    await b.step()  # no time has passed on b's clock
    await settle(b)
    assert b.leading and lease(api)["holderIdentity"] == "b"


async def test_a_new_leader_serves_only_once_its_view_is_current(api: KubeApiServer, make: Make) -> None:
    listed = asyncio.Event()

    async def relist() -> None:
        await listed.wait()

    a = make("a", Clock(), on_elected=relist)
    await a.step()
    assert a.leading and "listing pods and nodes" in a.refusal()
    listed.set()
    await settle(a)
    assert a.refusal() == ""


class CreateRace(Flaky):
    """Both candidates see 404 before either creates; records what each create answered."""

    def __init__(self, api: PodCalls):
        super().__init__(api)
        self.missing = 0
        self.both_missing = asyncio.Event()
        self.created: list[int] = []

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await self.api.get_lease(namespace, name)
        except ApiCallError as e:
            if e.status == 404:
                self.missing += 1
                if self.missing == 2:
                    self.both_missing.set()
                await self.both_missing.wait()
            raise

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            got = await self.api.create_lease(namespace, body)
        except ApiCallError as e:
            self.created.append(e.status)
            raise
        self.created.append(201)
        return got


async def test_a_missing_lease_is_created_and_a_create_race_is_lost_cleanly(api: KubeApiServer, calls: PodCalls,
                                                                           make: Make) -> None:
    clock = Clock()
    race = CreateRace(calls)
    a, b = make("a", clock, race), make("b", clock, race)
    await asyncio.gather(a.step(), b.step())
    assert sorted(race.created) == [201, 409]
    assert [a.leading, b.leading].count(True) == 1


def test_timings_that_cannot_work_are_refused() -> None:
    assert settings_problem(15, 10, 2) == ""
    assert settings_problem(3, 2, 0.3) == ""
    assert "renew-deadline" in settings_problem(15, 15, 2)
    assert "renew-deadline" in settings_problem(15, 14.5, 2)  # no second left for the last write
    assert "retry-period" in settings_problem(15, 10, 10)
    assert "retry-period" in settings_problem(15, 10, 9)  # renew deadline < 1.2 x retry
    assert "whole seconds" in settings_problem(2.5, 1, 0.5)
    assert "whole seconds" in settings_problem(0, 1, 0.5)
    assert "retry-period" in settings_problem(3, 1.5, 0.01)
    with pytest.raises(ValueError):
        ElectionSettings(identity="", namespace=NS)


async def test_relist_cuts_the_watch_and_lists_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A new leader's relist must not wait for the watch's next event: with no bookmarks for an hour, each relist
    still completes, and its list is not sent on the cut watch's connection (which urllib3 would find broken
    and retry)."""
    from gpumgr.extender.kubeaccess import KubeAccess
    from gpumgr.extender.watcher import Watcher
    from tests.extender.support import inventory, node

    async with KubeApiServer(bookmark_interval=3600) as api:
        api.store.create_node(node("n0", inventory(1)))
        access = KubeAccess(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        lists: list[list[Any]] = []
        events: list[str] = []
        watcher = Watcher(access, "nodes", asyncio.get_running_loop(), lambda n: n["metadata"]["name"],
                          lists.append, lambda kind, name: events.append(name))
        watcher.start()
        try:
            async with asyncio.timeout(30):
                while not lists:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # the watch is open and idle
                for i in range(3):
                    api.store.create_node(node(f"m{i}", inventory(1)))
                    await watcher.relist()
                    assert f"m{i}" in lists[-1]
                for _ in range(5):  # at once again: the watch is being opened right after a list
                    await watcher.relist()
            assert len(lists) >= 9
            assert not [r for r in caplog.records if "Retrying" in r.getMessage()], caplog.text
        finally:
            await asyncio.get_running_loop().run_in_executor(None, watcher.stop)
            access.close()
