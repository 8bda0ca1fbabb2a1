"""Review findings on the admission code (failing a pod at PreStart, settling guesses against concurrent changes,
truths that cannot all be placed, error handling), each through the real protocols where it can be reached."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import grpc
import pytest

from gpumgr.agent.truth import apply_truths
from gpumgr.allocator import Allocation, ContainerHolder, Ledger
from gpumgr.deviceplugin import ids as devids
from gpumgr.node import binding
from gpumgr.node.kubelet_checkpoint import read_kubelet_checkpoint
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.vdevice.layout import allocation_key
from tests.admission.test_findings import CORE, recorded_on, seen
from tests.e2e.harness import sim_node


def _checkpoint(node, entries: list[tuple[dict, str, list[str]]]):
    """A kubelet checkpoint naming (pod, container, IDs), which the agent is pointed at."""
    path = node.workdir / "kubelet_checkpoint_for_test"
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": pod["metadata"]["uid"], "ContainerName": name, "ResourceName": CORE, "DeviceIDs": {"0": ids}}
        for pod, name, ids in entries], "RegisteredDevices": {}}, "Checksum": 1}))
    svc = node.agent.service
    svc.config = dataclasses.replace(svc.config, kubelet_checkpoint=path)
    return path


def _stub(channel):
    return pb_grpc.DevicePluginStub(channel)


def _core_channel(node):
    return grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}")


def _guess(svc, pod, container: str, card: int, ids: list[str], verified: bool = False) -> Allocation:
    cand = binding.Candidate(pod, binding.find_container(pod, container), None, ())
    return svc._allocation_for(cand, (card,), allocation_key(ids), verified=verified, ids=ids)


async def test_failing_a_pod_at_prestart_keeps_its_running_containers_share_and_refuses_its_retries(monkeypatch):
    """Pod `big` has `side` verified (running) on card 1 and `main` recorded on card 0 where it does not fit; the
    API is down so the pod cannot be marked Failed. `side` keeps its share (the pod still runs), `main`'s guess is
    freed, and the kubelet's retried PreStart of `main` is refused again rather than squeezed into freed room."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        filler = node.create_pod("filler", [("main", 60, 50)], annotations=recorded_on(node, 0))
        await seen(node, filler)
        await node.admit(filler)
        small = node.create_pod("small", [("main", 30, 8)])
        big = node.create_pod("big", [("side", 30, 8), ("main", 30, 40)])
        await seen(node, small, big)
        side_ids = sorted(devids.core_ids(node.inventory.gpus[1]))[:30]
        side = _guess(svc, big, "side", 1, side_ids, verified=True)
        await st.commit(lambda ledger: ledger.assign(side))
        ids = sorted(set(devids.core_ids(node.inventory.gpus[0])) - node.kubelet.allocated(CORE))[:30]
        await st.commit(lambda ledger: ledger.assign(_guess(svc, small, "main", 0, ids)))
        _checkpoint(node, [(big, "main", ids), (big, "side", side_ids)])

        calls = []

        async def outage(*args, **kwargs):
            calls.append(args)
            raise RuntimeError("API outage")

        from gpumgr.agent import podwrites as settle_mod

        monkeypatch.setattr(settle_mod, "FAIL_RETRY_S", 0.0)
        svc.annotator.fail_pod = outage
        async with _core_channel(node) as ch:
            for attempt in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _stub(ch).PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=10)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, attempt
                await svc.drain()
                assert st.ledger.held_by(side.key) == side, attempt
                assert st.ledger.held_by(allocation_key(ids)) is None, attempt
        assert "was failed at PreStartContainer" in e.value.details()
        assert node.pod("big")["status"].get("phase") != "Failed"
        assert svc.prestart_failures == 1
        assert len(calls) == settle_mod.FAIL_ATTEMPTS  # retried, for one decision: the refused retry adds none


async def test_settle_never_brings_back_an_allocation_released_while_it_waited():
    """A guess the kubelet names the owner of is settled; the settle is decided while a release of the same key
    waits for the ledger before it. The released key stays released."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        small = node.create_pod("small", [("main", 30, 8)])
        big = node.create_pod("big", [("main", 30, 12)])
        await seen(node, small, big)
        ids = sorted(devids.core_ids(node.inventory.gpus[0]))[:30]
        key = allocation_key(ids)
        guess = _guess(svc, small, "main", 0, ids)
        guess = dataclasses.replace(guess, memory_mib=12 * 256, guess_of=2)
        await st.commit(lambda ledger: ledger.assign(guess))
        kc = read_kubelet_checkpoint(_checkpoint(node, [(big, "main", ids)]))
        await st.lock.acquire()
        try:
            release = asyncio.ensure_future(svc.release([key], "released meanwhile"))
            await asyncio.sleep(0)
            settle = asyncio.ensure_future(svc._settle(kc))
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            st.lock.release()
        await asyncio.gather(release, settle)
        assert st.ledger.held_by(key) is None


def test_truths_that_cannot_all_be_placed_leave_every_held_allocation_as_it_was():
    """Two guesses on one 8 GiB card; the owners the kubelet names need more than the card has. Neither held
    allocation is dropped; both are reported, by key."""
    ledger = Ledger([8192])
    a = Allocation("a", (0,), 30, 2048)
    b = Allocation("b", (0,), 30, 3072)
    ledger.assign(a)
    ledger.assign(b)
    before = ledger.to_json()
    grown_a = dataclasses.replace(a, memory_mib=6144, holder=ContainerHolder("ux", "default", "x", "main"))
    grown_b = dataclasses.replace(b, memory_mib=4096, holder=ContainerHolder("uy", "default", "y", "main"))
    conflicts = apply_truths(ledger, [grown_a, grown_b], recorded={"a", "b"})
    assert ledger.to_json() == before
    assert sorted(k for k, _ in conflicts) == ["a", "b"]
    # the ones that fit are still placed
    ok = apply_truths(ledger, [dataclasses.replace(a, memory_mib=4096)], recorded={"a", "b"})
    assert ok == [] and ledger.held_by("a").memory_mib == 4096 and ledger.held_by("b") == b


async def test_an_unexpected_error_in_get_preferred_allocation_is_internal_without_a_traceback():
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc = node.agent.service

        async def broken(*args, **kwargs):
            raise KeyError("boom")

        svc.preferred = broken
        ids = sorted(devids.core_ids(node.inventory.gpus[0]))
        async with _core_channel(node) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _stub(ch).GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=30)]),
                    timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "internal error: KeyError" in e.value.details() and "boom" not in e.value.details()


async def test_an_unexpected_error_in_allocate_gives_the_kubelet_its_type_only():
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc = node.agent.service

        async def broken(*args, **kwargs):
            raise KeyError("secret internals")

        svc.allocate_core = broken
        ids = sorted(devids.core_ids(node.inventory.gpus[0]))[:30]
        async with _core_channel(node) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _stub(ch).Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "internal error: KeyError" in e.value.details() and "secret" not in e.value.details()


async def test_a_repeated_allocate_does_not_repeat_an_unconfirmed_memory_annotation():
    """The kubelet asks again for IDs held by an unverified guess whose first answer named a memory: that memory
    may be another pod's, so the repeated answer leaves it out."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        small = node.create_pod("small", [("main", 30, 8)])
        await seen(node, small)
        ids = sorted(devids.core_ids(node.inventory.gpus[0]))[:30]
        guess = _guess(svc, small, "main", 0, ids)
        guess = dataclasses.replace(guess, answered_memory_mib=8 * 256)
        await st.commit(lambda ledger: ledger.assign(guess))
        async with _core_channel(node) as ch:
            got = await _stub(ch).Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        assert "tencent.com/vcuda-memory" not in got.container_responses[0].annotations
        assert st.ledger.held_by(guess.key) == guess


async def test_kubelet_checkpoint_reads_do_not_wait_for_a_full_default_executor():
    """API calls run on the default executor; with it full (an API outage), reading the kubelet checkpoint, which
    every Allocate and PreStart does, still completes."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc = node.agent.service
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        workers = getattr(loop, "_default_executor", None)
        n = workers._max_workers if workers is not None else 64
        blocked = [loop.run_in_executor(None, gate.wait) for _ in range(n + 2)]
        try:
            read = asyncio.ensure_future(svc.kubelet_checkpoint())
            done, _ = await asyncio.wait([read], timeout=10)
            assert read in done
        finally:
            gate.set()
            await asyncio.gather(*blocked)


async def test_prestart_answers_while_the_api_hangs():
    """A pod list that never answers and a fail_pod call that never answers do not hold PreStart past the
    kubelet's timeout: the refusal comes back, and marking the pod Failed goes on in the background."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        filler = node.create_pod("filler", [("main", 60, 50)], annotations=recorded_on(node, 0))
        await seen(node, filler)
        await node.admit(filler)
        small = node.create_pod("small", [("main", 30, 8)])
        big = node.create_pod("big", [("main", 30, 40)])
        await seen(node, small, big)
        ids = sorted(set(devids.core_ids(node.inventory.gpus[0])) - node.kubelet.allocated(CORE))[:30]
        await st.commit(lambda ledger: ledger.assign(_guess(svc, small, "main", 0, ids)))
        _checkpoint(node, [(big, "main", ids)])
        api_back = asyncio.Event()

        async def hang(*args, **kwargs):
            await api_back.wait()
            return True

        svc.annotator.fail_pod = hang
        try:
            async with _core_channel(node) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _stub(ch).PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=10)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not fit" in e.value.details()
        finally:
            api_back.set()
            await svc.drain()


async def test_prestart_for_a_pod_missing_from_the_cache_gives_up_on_a_hung_list(monkeypatch):
    from gpumgr.agent import prestart as service_mod

    monkeypatch.setattr(service_mod, "PRESTART_LIST_S", 0.2, raising=False)  # (absent before the fix)
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc = node.agent.service
        ghost = {"metadata": {"uid": "not-in-the-cache", "name": "ghost", "namespace": "default"}}
        ids = sorted(devids.core_ids(node.inventory.gpus[0]))[:30]
        _checkpoint(node, [(ghost, "main", ids)])
        api_back = asyncio.Event()

        async def hang():
            await api_back.wait()

        monkeypatch.setattr(svc.pods, "refresh", hang)
        try:
            async with _core_channel(node) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _stub(ch).PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=10)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not on node" in e.value.details()
        finally:
            api_back.set()


async def test_an_init_containers_partly_reused_devices_still_free_the_dead_holders():
    """The kubelet hands an app container some of its init container's devices plus others; a holder of a gone
    pod that the kubelet let go is freed in the same change as in every other case."""
    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        pod = node.create_pod("p", [("main", 30, 8)], init_containers=[("setup", 30, 8)])
        await seen(node, pod)
        card = sorted(devids.core_ids(node.inventory.gpus[0]))
        init = _guess(svc, pod, "setup", 0, card[:30])
        dead = Allocation(allocation_key(card[60:90]), (0,), 30, 256,
                           ContainerHolder("gone", "default", "gone", "main"), verified=True)
        await st.commit(lambda ledger: (ledger.assign(init), ledger.assign(dead)))
        app_ids = card[15:45]
        app = _guess(svc, pod, "main", 0, app_ids)
        await st.commit(svc._with_reuse(app, set(app_ids), [dead]))
        assert st.ledger.held_by(dead.key) is None and st.ledger.held_by(app.key) == app


def test_making_room_for_the_kubelets_word_never_evicts_an_allocation_made_after_it_was_read():
    """Unrecorded guesses on the card may be evicted for a truth, but only those the ledger had when the kubelet's
    checkpoint was read: a fresh one, answered since, stays (the kubelet could not have recorded it yet)."""
    ledger = Ledger([8192])
    guess = Allocation("g", (0,), 30, 2048)
    ledger.assign(guess)
    seen = dict(ledger.allocations)
    fresh = Allocation("fresh", (0,), 30, 4096)
    ledger.assign(fresh)
    truth = dataclasses.replace(guess, memory_mib=6144)
    conflicts = apply_truths(ledger, [truth], recorded={"g"}, seen=seen)
    assert [k for k, _ in conflicts] == ["g"]
    assert ledger.held_by("fresh") == fresh and ledger.held_by("g") == guess
    old = Allocation("old", (0,), 30, 4096)
    ledger.release("fresh")
    ledger.assign(old)
    assert apply_truths(ledger, [truth], recorded={"g"}, seen={**seen, "old": old}) == []
    assert ledger.held_by("old") is None and ledger.held_by("g") == truth


async def test_reconcile_never_frees_an_allocation_replaced_after_it_decided():
    """Reconcile decides an old unrecorded guess is stale; before its release gets the ledger, an Allocate's commit
    replaces that key's holder with a fresh one. The fresh one is not freed on the old one's account."""
    from gpumgr.agent.reconcile import reconcile

    async with sim_node("gtx1080ti", memory_mib=16384) as node:
        svc, st = node.agent.service, node.agent.state
        small = node.create_pod("small", [("main", 30, 8)])
        await seen(node, small)
        ids = sorted(devids.core_ids(node.inventory.gpus[0]))[:30]
        key = allocation_key(ids)
        old = _guess(svc, small, "main", 0, ids)
        await st.commit(lambda ledger: ledger.assign(dataclasses.replace(old, created=1)))
        _checkpoint(node, [])
        fresh = _guess(svc, small, "main", 0, ids)
        commit = st.commit

        def swap(ledger: Ledger) -> None:
            ledger.release(key)
            ledger.assign(fresh)

        async def allocate_first(change):  # the Allocate's commit was queued on the ledger lock first
            st.commit = commit
            await commit(swap)
            return await commit(change)

        st.commit = allocate_first
        await reconcile(svc, True, 60.0, "periodic")
        assert st.ledger.held_by(key) == fresh
