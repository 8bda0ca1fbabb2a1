"""Several `gpumgr extender` processes with --leader-elect behind one address (`front.Front`, a Service with
readiness): a storm of GPU pods scheduled through it while the leader is killed, paused or stopped.

What must hold: one replica serves at a time, a standby takes over, every pod ends bound or cleanly refused
because nothing fits, and no card is ever given past its capacity (summed from what is written to the API).
"""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpumgr.extender.claims import pod_claim
from gpumgr.extender.handlers import SYNCING
from gpumgr.extender.leaderlabel import LEADER_LABEL
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.front import Backend, Front
from tests.extender.support import (
    LEASE_NS,
    Replica,
    args,
    eventually,
    inventory,
    lease_holder,
    node,
    pod,
    replica_pod,
    start_replica,
)

NODES = ("n0", "n1", "n2")
CARDS = 2
CARD_MIB = 40960
UNIT_MIB = 256
ASK = (50, 40)  # half a card's cores, 10 GiB: two such pods fill a card
CAPACITY = len(NODES) * CARDS * 2
PODS = 20


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
def replicas(api: KubeApiServer, tmp_path: Path) -> Any:
    started: list[Replica] = []
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

    def start(count: int, **kw: Any) -> list[Replica]:
        names = [f"ext-{len(started) + i}" for i in range(count)]
        for name in names:
            api.store.create_pod(replica_pod(name))
        new = [start_replica(name, kubeconfig, tmp_path, **kw) for name in names]
        started.extend(new)
        return new

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGCONT)
        r.stop()


def cluster(api: KubeApiServer, pods: int = PODS) -> list[dict[str, Any]]:
    for name in NODES:
        api.store.create_node(node(name, inventory(CARDS, memory_mib=CARD_MIB), unit_mib=UNIT_MIB))
    return [api.store.create_pod(pod(f"p{i:02d}", [ASK])) for i in range(pods)]


def front_of(reps: list[Replica], api: KubeApiServer) -> Front:
    return Front([Backend(r.url, r.probe_url, pod=r.name) for r in reps], api.store, LEASE_NS)


def labelled(api: KubeApiServer) -> list[str]:
    """The replica pods carrying the leader label (what the Service routes to)."""
    return sorted(p["metadata"]["name"] for p in api.store.list_pods(LEASE_NS)
                  if (p["metadata"].get("labels") or {}).get(LEADER_LABEL) == "true")


def leader(reps: list[Replica], api: KubeApiServer) -> Replica | None:
    holder = lease_holder(api.store)
    return next((r for r in reps if r.holds(holder)), None)


async def ready_leader(front: Front, reps: list[Replica], api: KubeApiServer, timeout: float = 60,
                       other_than: Replica | None = None) -> Replica:
    """The replica holding the Lease, once the front routes to it alone."""
    async def check() -> Replica | None:
        ready = [b.url for b in front.ready()]
        found = leader(reps, api)
        ok = found is not None and found is not other_than and ready == [found.url]
        return found if ok else None

    found = await eventually(check, timeout=timeout, interval=0.1)
    assert found is not None, (lease_holder(api.store), [b.url for b in front.ready()], logs(reps))
    return found


def logs(reps: list[Replica]) -> str:
    return "\n".join(f"--- {r.name}\n{r.log.read_text()[-3000:]}" for r in reps)


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    try:
        async with http.post(url, json=body) as r:
            return r.status, await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        return 0, {"Error": str(e)}


async def schedule(http: aiohttp.ClientSession, url: str, p: dict[str, Any], api: KubeApiServer) -> str:
    """What kube-scheduler does for one pod, retrying on errors: "bound" or "unschedulable" (nothing fits)."""
    meta = p["metadata"]
    while True:
        status, doc = await post(http, f"{url}/gpumgr/filter", args(p, NODES))
        if status != 200:
            await asyncio.sleep(0.05)
            continue
        passed = doc.get("NodeNames") or []
        if not passed:
            reasons = {**(doc.get("FailedNodes") or {}), **(doc.get("FailedAndUnresolvableNodes") or {})}
            if SYNCING in reasons.values() or not reasons:
                await asyncio.sleep(0.05)
                continue
            return "unschedulable"
        status, doc = await post(http, f"{url}/gpumgr/prioritize", args(p, passed))
        if status != 200:
            await asyncio.sleep(0.05)
            continue
        best = max(doc, key=lambda h: h["Score"])["Host"]
        status, doc = await post(http, f"{url}/gpumgr/bind", {"PodName": meta["name"], "PodNamespace": "default",
                                                              "PodUID": meta["uid"], "Node": best})
        if status == 200 and doc.get("Error") == "":
            return "bound"
        if (api.store.get_pod("default", meta["name"]) or {}).get("spec", {}).get("nodeName"):
            return "bound"  # the answer was lost (the replica died after the Binding was made)
        await asyncio.sleep(0.05)


async def storm(http: aiohttp.ClientSession, url: str, pods: list[dict[str, Any]],
                api: KubeApiServer) -> dict[str, str]:
    """All pods at once; then those refused are tried once more, alone (a card held by a half-made bind of a
    killed replica may have come free since)."""
    async with asyncio.timeout(180):
        results = await asyncio.gather(*(schedule(http, url, p, api) for p in pods))
        outcome = {p["metadata"]["name"]: r for p, r in zip(pods, results, strict=True)}
        for p in pods:
            if outcome[p["metadata"]["name"]] == "unschedulable":
                outcome[p["metadata"]["name"]] = await schedule(http, url, p, api)
    return outcome


def card_use(api: KubeApiServer) -> dict[tuple[str, int], list[int]]:
    """(node, minor) -> [cores, MiB] held, from every pod's annotations and binding in the API."""
    use: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for p in api.store.list_pods():
        claim = pod_claim(p)
        if claim is None:
            continue
        for held in claim.held:
            for minor in held.minors:
                use[(claim.node, minor)][0] += held.cores // len(held.minors)
                use[(claim.node, minor)][1] += held.memory_units * UNIT_MIB // len(held.minors)
    return use


def assert_not_overcommitted(api: KubeApiServer) -> None:
    for (name, minor), (cores, mib) in card_use(api).items():
        assert cores <= 100 and mib <= CARD_MIB, f"node {name} card {minor}: {cores} cores, {mib} MiB"


def bound(api: KubeApiServer) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.store.list_pods() if p["spec"].get("nodeName"))


async def test_kill_the_leader_mid_storm(api: KubeApiServer, replicas: Any, http: aiohttp.ClientSession) -> None:
    pods = cluster(api)
    reps = replicas(3)
    async with front_of(reps, api) as front:
        first = await ready_leader(front, reps, api)

        async def kill_when_busy() -> int:
            while len(bound(api)) < 4:
                await asyncio.sleep(0.01)
            first.proc.kill()  # SIGKILL: no release, the standbys wait out the Lease
            return len(bound(api))

        killer = asyncio.ensure_future(kill_when_busy())
        outcome = await storm(http, front.url, pods, api)
        assert_not_overcommitted(api)
        at_kill = await killer
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
        second = leader(reps, api)
        assert second is not None and second is not first, logs(reps)
        # the killed leader never took its label off: the new leader took it from its pod
        assert labelled(api) == [second.name], logs(reps)
    assert_not_overcommitted(api)
    names = bound(api)
    assert sorted(n for n, r in outcome.items() if r == "bound") == names
    assert len(names) == CAPACITY, (outcome, card_use(api), logs(reps))  # every card full: nothing lost
    assert at_kill < len(names)  # scheduling went on after the kill
    assert all(r == "unschedulable" for n, r in outcome.items() if n not in names)
    assert api.store.get_object("leases", "gpumgr-extender", "gpu-system")["spec"]["leaseTransitions"] >= 1


async def test_a_paused_leader_binds_nothing_when_it_resumes(api: KubeApiServer, replicas: Any,
                                                             http: aiohttp.ClientSession) -> None:
    pods = cluster(api, pods=6)
    reps = replicas(2)
    async with front_of(reps, api) as front:
        old = await ready_leader(front, reps, api)
        old.proc.send_signal(signal.SIGSTOP)
        try:
            # binds sent straight to the paused leader wait in its socket's backlog
            late = [asyncio.ensure_future(post(http, f"{old.url}/gpumgr/bind", {
                "PodName": p["metadata"]["name"], "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
                "Node": "n0"})) for p in pods[:3]]
            new = await ready_leader(front, reps, api, other_than=old)
            assert labelled(api) == [new.name]  # taken from the paused leader's pod, which cannot do it itself
            assert await schedule(http, front.url, pods[3], api) == "bound"
            # On resume its renewal must not come back before the binds are handled: they have to be refused on
            # its own clock alone (the renewal was sent too long ago), not because it learnt of the new leader.
            api.store.gates["leases"] = asyncio.Event()
        finally:
            old.proc.send_signal(signal.SIGCONT)
        try:
            answers = await asyncio.gather(*late)
        finally:
            api.store.gates.pop("leases").set()
        for status, doc in answers:
            assert status == 503, answers
            # refused on its own clock: either the bind guard saw the renewal too old, or the election loop had
            # already stepped down for that reason (it knows of no other leader: the Lease reads are held)
            assert ("has not renewed its Lease" in doc["Error"]
                    or "no other replica is known to lead" in doc["Error"]), answers
        for p in pods[:3]:  # nothing written at all: not the cards (not even written and taken back), no Binding
            got = api.store.get_pod("default", p["metadata"]["name"])
            assert got is not None and not got["spec"].get("nodeName")
            assert got["metadata"]["resourceVersion"] == p["metadata"]["resourceVersion"], got["metadata"]
        # the resumed replica is a standby now: 503 on the verbs, not ready, but alive. Right after the Lease reads
        # are let through it may still say it knows of no leader; once it has read the Lease it names the new one.
        answers_seen: list[Any] = []

        async def standby_answer() -> Any:
            status, doc = await post(http, f"{old.url}/gpumgr/filter", args(pods[4], NODES))
            answers_seen.append((status, doc))
            assert status == 503 and "not the leader" in doc["Error"], doc  # never serving again meanwhile
            return doc if f"replica '{new.name}_" in doc["Error"] else None

        doc = await eventually(standby_answer, timeout=30, interval=0.1)
        assert doc is not None, answers_seen[-3:]
        assert bound(api) == [pods[3]["metadata"]["name"]]
        assert_not_overcommitted(api)


async def test_sigterm_hands_the_lease_over(api: KubeApiServer, replicas: Any, http: aiohttp.ClientSession) -> None:
    pods = cluster(api, pods=3)
    # a Lease far longer than this test waits: the standby can only take over this soon if it is released
    reps = replicas(2, duration="300", renew="20", retry="0.3")
    async with front_of(reps, api) as front:
        old = await ready_leader(front, reps, api)
        standby = next(r for r in reps if r is not old)

        async def standby_state() -> Any:
            try:
                async with http.get(f"{standby.probe_url}/healthz") as alive, \
                        http.get(f"{standby.probe_url}/readyz") as ready:
                    doc = await ready.json()
                    state = (alive.status, ready.status, doc["status"], doc.get("leader"))
            except aiohttp.ClientError:
                return None  # still starting
            return state if state[2] != "syncing" else None

        # ready (a rolling update and a disruption budget count it), but not routed to: its pod has no label
        assert await eventually(standby_state, timeout=60, interval=0.1) == (200, 200, "ready", False)
        assert labelled(api) == [old.name]

        async def names_the_leader() -> bool:  # a standby learns the holder at its next read of the Lease
            async with http.post(f"{standby.url}/gpumgr/filter", json=args(pods[0], NODES)) as r:
                return f"replica '{old.name}_" in (await r.json())["Error"]

        assert await eventually(names_the_leader, timeout=60, interval=0.1)
        for verb, body in (("filter", args(pods[0], NODES)), ("prioritize", args(pods[0], NODES)),
                           ("bind", {"PodName": "p00", "PodNamespace": "default", "PodUID": "", "Node": "n0"})):
            async with http.post(f"{standby.url}/gpumgr/{verb}", json=body) as r:
                doc = await r.json()
                assert r.status == 503 and f"replica '{old.name}_" in doc["Error"], (verb, doc)
                # closed, so that a Service sends the caller's next connection to a ready replica
                assert r.headers.get("Connection", "").lower() == "close", (verb, dict(r.headers))
        assert await schedule(http, front.url, pods[0], api) == "bound"
        old.proc.send_signal(signal.SIGTERM)
        assert await asyncio.get_running_loop().run_in_executor(None, lambda: old.proc.wait(timeout=30)) == 0
        new = await ready_leader(front, reps, api, timeout=60, other_than=old)
        assert new is standby
        assert labelled(api) == [new.name]  # the old leader took its label off when it stepped down
        assert await schedule(http, front.url, pods[1], api) == "bound"
    assert "released Lease gpu-system/gpumgr-extender" in old.log.read_text()
    assert_not_overcommitted(api)
