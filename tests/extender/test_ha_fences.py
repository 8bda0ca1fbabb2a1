"""What keeps the election and a deposed leader's binds safe: hostile Lease records, an election loop that must
not die silently, the leadership term, a shutdown that sticks, a sync that cannot last forever, and the
Binding's resourceVersion precondition."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from asyncio import timeout as timeout_of
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpumgr.extender.kubeaccess import ApiCallError, api_client
from gpumgr.extender.leader import MAX_RECORD_DURATION, ElectionSettings, Elector, boottime
from gpumgr.extender.podcalls import PodCalls
from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import inventory, node, pod
from tests.extender.test_ha_election import LEASE, NS, Clock, Flaky, Make, lease, settle


class Doctored(Flaky):
    """A LeaseApi whose reads come back altered by `doctor` (a record another process wrote badly)."""

    def __init__(self, api: PodCalls, doctor: Callable[[dict[str, Any]], None]):
        super().__init__(api)
        self.doctor = doctor

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        got = copy.deepcopy(await self.api.get_lease(namespace, name))
        self.doctor(got)
        return got


def set_spec(value: Any) -> Callable[[dict[str, Any]], None]:
    def doctor(doc: dict[str, Any]) -> None:
        doc["spec"] = value
    return doctor


def set_duration(value: Any) -> Callable[[dict[str, Any]], None]:
    def doctor(doc: dict[str, Any]) -> None:
        doc["spec"]["leaseDurationSeconds"] = value
    return doctor


async def test_an_unreadable_record_counts_as_expired_and_is_overwritten(api: KubeApiServer, calls: PodCalls,
                                                                         make: Make) -> None:
    clock = Clock()
    a = make("a", clock)
    await a.step()
    for bad in (["a"], "a", 7):
        b = make("b", clock, Doctored(calls, set_spec(bad)))
        await b.step()
        await settle(b)
        assert b.leading, bad
        assert lease(api)["holderIdentity"] == "b"
        await b.stop(release=True)


@pytest.mark.parametrize("duration", [10**400, 2**31 - 1], ids=["10**400", "2**31-1"])
async def test_a_huge_lease_duration_of_another_holder_is_waited_out_only_so_long(
        api: KubeApiServer, calls: PodCalls, make: Make, duration: int) -> None:
    clock = Clock()
    a = make("a", clock)
    await a.step()
    b = make("b", clock, Doctored(calls, set_duration(duration)))
    await b.step()
    clock.now += MAX_RECORD_DURATION - 1
    await b.step()
    assert not b.leading
    clock.now += 2
    await b.step()
    assert b.leading and lease(api)["holderIdentity"] == "b"


async def test_a_hostile_holder_name_is_shown_cut_and_quoted(api: KubeApiServer, calls: PodCalls,
                                                              make: Make) -> None:
    def hostile(doc: dict[str, Any]) -> None:
        doc["spec"]["holderIdentity"] = "evil\nreplica ok leads" + "x" * 2_000_000

    clock = Clock()
    await make("a", clock).step()
    b = make("b", clock, Doctored(calls, hostile))
    await b.step()
    why = b.refusal()
    assert not b.leading and "\n" not in why and len(why) < 500
    assert "replica 'evil\\nreplica ok leads" in why


async def test_the_loop_survives_records_and_errors_nobody_expected(api: KubeApiServer, calls: PodCalls,
                                                                    make: Make,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    def no_metadata(doc: dict[str, Any]) -> None:
        doc["metadata"] = "oops"

    class Broken(Flaky):
        async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
            raise KeyError("nobody expected this")

    clock = Clock()
    await make("a", clock).step()
    for lease_api, said in ((Doctored(calls, no_metadata), "no resourceVersion"), (Broken(calls), "nobody expected")):
        b = make("b", clock, lease_api)
        b.start()
        async with timeout_of(30):  # the loop tries and fails (however long a loaded machine takes) ...
            while said not in caplog.text:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # ... and keeps going
        assert b.failure() == "" and not b.leading
        await b.stop(release=False)
    assert "no resourceVersion" in caplog.text and "nobody expected this" in caplog.text
    assert "Traceback" not in caplog.text


async def test_credentials_that_fail_are_an_api_error(api: KubeApiServer, tmp_path: Path) -> None:
    client = api_client(str(api.write_kubeconfig(tmp_path / "kubeconfig")))

    def broken() -> dict[str, Any]:
        raise RuntimeError("the exec plugin failed")

    client.configuration.auth_settings = broken
    pc = PodCalls(client.configuration)
    try:
        with pytest.raises(ApiCallError, match="the exec plugin failed"):
            await pc.get_lease(NS, LEASE)
    finally:
        await pc.close()
        client.close()


async def test_a_replica_stepping_down_does_not_lead_again(api: KubeApiServer, make: Make) -> None:
    clock = Clock()
    a = make("a", clock)
    await a.step()
    await settle(a)
    a.step_down()
    clock.now += 2
    await a.step()  # the Lease is still its own: it must not start leading again while shutting down
    assert not a.leading and "shutting down" in a.refusal()


async def test_a_term_ends_when_leadership_is_lost_even_if_won_back(api: KubeApiServer, calls: PodCalls,
                                                                    make: Make) -> None:
    clock = Clock()
    flaky = Flaky(calls)
    a = make("a", clock, flaky)
    await a.step()
    await settle(a)
    why, term = a.check()
    assert why == ""
    flaky.down = True
    clock.now += 10.5
    await a.step()
    assert not a.leading
    flaky.down = False
    await a.step()
    await settle(a)
    why, again = a.check()
    assert why == "" and again != term


async def test_a_leader_that_cannot_sync_hands_the_lease_over(api: KubeApiServer, calls: PodCalls) -> None:
    async def never() -> None:
        raise ApiCallError(0, "ConnectionRefusedError: the list fails")

    clock = Clock()
    settings = ElectionSettings(identity="a", namespace=NS, lease_duration=2, renew_deadline=1, retry_period=0.5)
    a = Elector(settings, calls, clock=clock, on_elected=never)
    await a.step()
    assert a.leading
    async with asyncio.timeout(20):
        # 2 x the lease duration of real time; it stops leading first, then writes the release (a loaded machine
        # showed the gap between the two)
        while a.leading or lease(api)["holderIdentity"] != "":
            await asyncio.sleep(0.05)
    assert not a.leading and lease(api)["holderIdentity"] == ""  # released: a standby takes over at once
    await a.step()
    assert not a.leading and lease(api)["holderIdentity"] == ""  # it sits out one lease duration
    clock.now += 2.1
    await a.step()
    assert a.leading


async def test_health_fails_when_the_election_loop_ends(start_extender: Any, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)  # outside a cluster: the leader labels no pod, and says so once
    caplog.set_level(logging.INFO, logger="gpumgr.extender.leaderlabel")
    settings = ElectionSettings(identity="solo", namespace=NS, lease_duration=3, renew_deadline=2,
                                retry_period=0.3)
    ext = await start_extender(election=settings, probe=("127.0.0.1", 0))
    probe = f"http://127.0.0.1:{ext.server.probe_port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{probe}/healthz") as r:
            assert r.status == 200
        async with timeout_of(10):
            while (ext.server.elector is None or ext.server.elector.refusal()):
                await asyncio.sleep(0.02)
        async with http.get(f"{probe}/readyz") as r:
            assert r.status == 200 and (await r.json())["leader"] is True
        assert caplog.text.count("POD_NAME or POD_NAMESPACE is not set") == 1
        loop = next(t for t in asyncio.all_tasks() if t.get_name() == "gpumgr-extender-election")
        loop.cancel()
        await asyncio.wait([loop], timeout=30)  # it has ended (its cleanup may take a while on a loaded machine)
        assert loop.done()
        async with http.get(f"{probe}/healthz") as r:
            assert r.status == 500 and "election" in (await r.json())["reason"]
        async with http.get(f"{probe}/readyz") as r:
            assert r.status == 503


async def test_a_late_binding_cannot_bind_cards_a_newer_leader_rewrote(api: KubeApiServer,
                                                                       start_extender: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A writes the cards and is slow to bind; meanwhile B (a newer leader) writes other cards for the pod. A's
    Binding carries the version A wrote: the API refuses it, the pod stays unbound, B's annotations stay."""
    api.store.create_node(node("n", inventory(2)))
    api.store.create_node(node("m", inventory(2)))
    p = api.store.create_pod(pod("p", [(100, 0)]))
    ext = await start_extender()
    binder = ext.server.binder
    assert binder is not None
    real = binder.access

    class Slow:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            written = await real.patch_pod(namespace, name, patch)
            # B takes over and records node m's card for the same pod
            api.store.merge_patch_pod(namespace, name, {"metadata": {"annotations": {
                podspec.ANN_PREDICATE_NODE: "m", podspec.ANN_PREDICATE_TIME: "42",
                f"{podspec.ANN_PREDICATE_IDX}0": "1"}}})
            return written

    binder.access = Slow()  # type: ignore[assignment]
    with caplog.at_level(logging.INFO):
        error = await ext.bind(p, "n")
    assert "cannot create the Binding" in error and "409" in error
    got = api.store.get_pod("default", "p")
    assert got is not None and not got["spec"].get("nodeName")
    assert got["metadata"]["annotations"][podspec.ANN_PREDICATE_NODE] == "m"
    assert got["metadata"]["annotations"][podspec.ANN_PREDICATE_TIME] == "42"


async def test_the_api_refuses_a_binding_of_another_pod_version(api: KubeApiServer, calls: PodCalls) -> None:
    p = api.store.create_pod(pod("p", [(100, 0)]))
    stale = p["metadata"]["resourceVersion"]
    api.store.merge_patch_pod("default", "p", {"metadata": {"labels": {"x": "y"}}})
    with pytest.raises(ApiCallError) as e:
        await calls.bind_pod("default", "p", p["metadata"]["uid"], "n", stale)
    assert e.value.status == 409 and "ResourceVersion" in str(e.value)
    now = api.store.get_pod("default", "p")
    assert now is not None and not now["spec"].get("nodeName")
    await calls.bind_pod("default", "p", p["metadata"]["uid"], "n", now["metadata"]["resourceVersion"])
    assert (api.store.get_pod("default", "p") or {})["spec"]["nodeName"] == "n"


def test_a_watch_stream_is_cut_without_urllib3s_shutdown() -> None:
    """urllib3 < 2.3 (which kubernetes >= 30 allows) has no HTTPResponse.shutdown(): relist still wakes the
    watch thread at once, through the socket of the response's connection."""
    import socket
    import threading

    from gpumgr.extender.watcher import cut_stream

    here, there = socket.socketpair()

    class Connection:
        sock = here

    class OldResponse:  # what urllib3 2.2's HTTPResponse offers for this
        _connection = Connection()

    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(here.recv(1)))
    reader.start()
    try:
        cut_stream(OldResponse())
        reader.join(timeout=5)
        assert not reader.is_alive() and got == [b""]
    finally:
        here.close()
        there.close()


@pytest.mark.parametrize("held", [0.3, None], ids=["bind-finishes", "bind-outlasts-the-wait"])
async def test_shutdown_waits_for_binds_and_releases_only_when_none_can_still_write(
        api: KubeApiServer, start_extender: Any, monkeypatch: pytest.MonkeyPatch, held: float | None) -> None:
    """SIGTERM with a bind between its writes: the bind is not cut by the HTTP server's shutdown, it writes no
    Binding (the replica no longer leads), and the Lease is released only if every bind finished by itself."""
    import gpumgr.extender.server as server_module

    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.setattr(server_module, "SETTLE_TIMEOUT", 3.0)
    api.store.create_node(node("n", inventory(2)))
    p = api.store.create_pod(pod("p", [(100, 0)]))
    settings = ElectionSettings(identity="solo", namespace=NS, lease_duration=15, renew_deadline=10,
                                retry_period=0.2)
    ext = await start_extender(election=settings)
    async with asyncio.timeout(20):
        while ext.server.elector is None or ext.server.elector.refusal():
            await asyncio.sleep(0.02)
    gate = asyncio.Event()
    api.store.gates["pods"] = gate  # the bind's annotation patch waits here
    binding = asyncio.ensure_future(ext.bind(p, "n"))
    async with asyncio.timeout(10):
        while ext.server.binder is None or not ext.server.binder.in_flight:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    if held is not None:
        asyncio.get_running_loop().call_later(held + 2.0, gate.set)  # after the HTTP server's 2 s shutdown
    try:
        await ext.server.stop()
    finally:
        gate.set()
        api.store.gates.clear()
    with contextlib.suppress(Exception):
        await binding
    got = api.store.get_pod("default", "p")
    assert got is not None and not got["spec"].get("nodeName")
    holder = lease(api)["holderIdentity"]
    if held is not None:
        assert holder == ""  # released: every bind was done
    else:
        assert holder == "solo"  # a cancelled bind may still write: the Lease is left to expire


def test_the_default_clock_keeps_counting_through_suspend(calls: PodCalls) -> None:
    import time

    elector = Elector(ElectionSettings(identity="a", namespace=NS), calls)
    assert elector.clock is boottime
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux: CLOCK_MONOTONIC stops while the host sleeps, this does not
        assert abs(boottime() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
