"""The claim cache (list + watch) lists the claims allocated here; prepare never takes a stale claim from it."""

from __future__ import annotations

import asyncio

from tests.dra.harness import NODE, NS, DraNode, share_request

DRIVER = "vgpu.gpumgr.io"


async def until(pred, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_recreated_claim_is_read_again(node: DraNode):
    assert node.fe is not None
    cache = node.fe.claims
    await asyncio.wait_for(cache.synced.wait(), 5)
    node.create_claim("c", [share_request(memory="1Gi", cores=10)])
    node.create_pod("p", {"gpu": {"resourceClaimName": "c"}})
    node.scheduler.schedule_pod(NS, "p", [NODE])
    first = node.claim("c")
    await until(lambda: (NS, "c") in cache._claims)
    resp = await node.kubelet.prepare(DRIVER, [(NS, "c", first["metadata"]["uid"])])
    assert resp.claims[first["metadata"]["uid"]].error == ""
    await node.kubelet.unprepare(DRIVER, [(NS, "c", first["metadata"]["uid"])])
    # the claim is deleted and made again under the same name, allocated on another card
    node.api.store.delete_object("resourceclaims", "c", NS)
    node.api.store.delete_pod(NS, "p")
    await until(lambda: (NS, "c") not in cache._claims)
    node.create_claim("c", [share_request(memory="2Gi", cores=20)])
    node.create_pod("p", {"gpu": {"resourceClaimName": "c"}})
    node.scheduler.schedule_pod(NS, "p", [NODE])
    second = node.claim("c")
    # the kubelet still names the old UID: whatever the cache holds, the answer is the API's
    resp = await node.kubelet.prepare(DRIVER, [(NS, "c", first["metadata"]["uid"])])
    assert "UID mismatch" in resp.claims[first["metadata"]["uid"]].error
    resp = await node.kubelet.prepare(DRIVER, [(NS, "c", second["metadata"]["uid"])])
    assert resp.claims[second["metadata"]["uid"]].error == ""
    [a] = node.dra_allocations().values()
    assert (a.cores, a.memory_mib) == (20, 2048)


async def test_claims_of_other_pools_are_not_kept(node: DraNode):
    assert node.fe is not None
    cache = node.fe.claims
    await asyncio.wait_for(cache.synced.wait(), 5)
    node.api.store.create_object("resourceclaims", {
        "metadata": {"name": "far"}, "spec": {"devices": {}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "g", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}]}}}}, NS)
    node.create_claim("near", [share_request()])
    node.create_pod("p", {"gpu": {"resourceClaimName": "near"}})
    node.scheduler.schedule_pod(NS, "p", [NODE])
    await until(lambda: (NS, "near") in cache._claims)
    assert (NS, "far") not in cache._claims


async def test_a_lagging_watch_never_hands_out_an_old_allocation_of_the_same_uid(node: DraNode, monkeypatch):
    import copy

    assert node.fe is not None
    cache = node.fe.claims
    await asyncio.wait_for(cache.synced.wait(), 5)
    node.create_claim("c", [share_request(memory="1Gi", cores=10)])
    node.create_pod("p", {"gpu": {"resourceClaimName": "c"}})
    node.scheduler.schedule_pod(NS, "p", [NODE])
    old = node.claim("c")
    uid = old["metadata"]["uid"]
    await until(lambda: (NS, "c") in cache._claims)
    apply = cache._apply
    monkeypatch.setattr(cache, "_apply", lambda kind, claim: None)  # the watch lags from here on
    # deallocated and allocated again under the same UID: another card, other amounts
    fresh = copy.deepcopy(old["status"])
    [result] = fresh["allocation"]["devices"]["results"]
    result.update(device="gpu-3", consumedCapacity={"memory": "2Gi", "cores": "20"})
    node.api.store.merge_patch_object("resourceclaims", "c", {"status": fresh}, NS)
    apply("MODIFIED", old)  # what the cache still holds
    resp = await node.kubelet.prepare(DRIVER, [(NS, "c", uid)])
    assert resp.claims[uid].error == ""
    [a] = node.dra_allocations().values()
    assert (a.cards, a.cores, a.memory_mib) == ((3,), 20, 2048)
