"""Bad claims get a clear per-claim error and change nothing; the other claims of the call are prepared."""

from __future__ import annotations

import copy

import pytest

from gpumgr.allocator.ledger import Allocation, ContainerHolder
from tests.dra.harness import NODE, NS, DraNode, share_request

DRIVER = "vgpu.gpumgr.io"


def allocate(node: DraNode, name: str, memory: str = "4Gi", cores: int = 30) -> dict:
    node.create_claim(name, [share_request(memory=memory, cores=cores)])
    node.create_pod(f"pod-{name}", {"gpu": {"resourceClaimName": name}})
    node.scheduler.schedule_pod(NS, f"pod-{name}", [NODE])
    return node.claim(name)


def results_patch(claim: dict, **changes: object) -> dict:
    status = copy.deepcopy(claim["status"])
    status["allocation"]["devices"]["results"][0].update(changes)
    return {"status": status}


def snapshot(node: DraNode) -> tuple:
    assert node.state is not None
    return (node.state.ledger.to_json(), sorted(p.name for p in node.cfg.cdi_dir.glob("*")),
            sorted(node.layout.keys()), node.state.store.generation)


async def prepare(node: DraNode, *claims: tuple[str, str, str]):
    return await node.kubelet.prepare(DRIVER, list(claims))


async def test_each_bad_claim_fails_alone_and_changes_nothing(node: DraNode):
    good = allocate(node, "good")
    unknown = allocate(node, "unknown")
    node.api.store.merge_patch_object("resourceclaims", "unknown", results_patch(unknown, device="gpu-9"), NS)
    other = allocate(node, "other")
    node.api.store.merge_patch_object("resourceclaims", "other",
                                      results_patch(other, driver="gpu.example.com"), NS)
    elsewhere = allocate(node, "elsewhere")
    node.api.store.merge_patch_object("resourceclaims", "elsewhere", results_patch(elsewhere, pool="node-b"), NS)
    garbage = allocate(node, "garbage")
    node.api.store.merge_patch_object("resourceclaims", "garbage",
                                      results_patch(garbage, consumedCapacity={"memory": "lots", "cores": "30"}),
                                      NS)
    uid_mismatch = allocate(node, "recreated")
    unallocated = node.create_claim("pending", [share_request()])
    before = snapshot(node)
    bad = [
        (NS, "unknown", unknown["metadata"]["uid"]),
        (NS, "other", other["metadata"]["uid"]),
        (NS, "elsewhere", elsewhere["metadata"]["uid"]),
        (NS, "garbage", garbage["metadata"]["uid"]),
        (NS, "recreated", "0a0a0a0a-0000-0000-0000-000000000000"),
        (NS, "missing", "1b1b1b1b-0000-0000-0000-000000000000"),
        (NS, "pending", unallocated["metadata"]["uid"]),
        (NS, "Bad_Name", "2c2c2c2c-0000-0000-0000-000000000000"),
        (NS, "bad-uid", "../../etc"),
    ]
    resp = await prepare(node, *bad)
    errors = {name: resp.claims[uid].error for _, name, uid in bad}
    assert "no such device" in errors["unknown"] and "gpu-9" in errors["unknown"]
    assert "no device of driver vgpu.gpumgr.io" in errors["other"] and "gpu.example.com" in errors["other"]
    assert "not this node's pool" in errors["elsewhere"]
    assert "not a quantity" in errors["garbage"]
    assert "UID mismatch" in errors["recreated"]
    assert "not found" in errors["missing"]
    assert "not allocated" in errors["pending"]
    assert "not a valid namespace and name" in errors["Bad_Name"]
    assert "not a Kubernetes UID" in errors["bad-uid"]
    assert all(not resp.claims[uid].devices for _, _, uid in bad)
    assert snapshot(node) == before
    assert uid_mismatch  # the real claim is untouched and still prepares
    # a good claim in the same call as bad ones is prepared
    resp = await prepare(node, (NS, "good", good["metadata"]["uid"]), bad[0])
    assert resp.claims[good["metadata"]["uid"]].error == ""
    assert resp.claims[good["metadata"]["uid"]].devices[0].cdi_device_ids
    assert resp.claims[bad[0][2]].error
    assert list(node.dra_allocations()) == [f"dra/{good['metadata']['uid']}/0"]


async def test_an_over_committed_claim_is_refused_by_the_node_and_nothing_is_half_prepared(node: DraNode):
    # something the scheduler does not know about yet holds 80 cores of gpu-0 (a device-plugin pod admitted
    # while the slice update is on its way); the scheduler places a 30-core claim there anyway
    assert node.state is not None and node.fe is not None
    await node.fe.publisher.stop()
    dp = Allocation(key="a0123", cards=(0,), cores=80, memory_mib=1024,
                    holder=ContainerHolder("dp-uid", "default", "dp-pod", "main"), verified=True)
    await node.state.commit(lambda led: led.assign(dp))
    claim = allocate(node, "too-much", cores=30)
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    before = snapshot(node)
    uid = claim["metadata"]["uid"]
    resp = await prepare(node, (NS, "too-much", uid))
    assert "does not fit on node dra-node" in resp.claims[uid].error
    assert "card 0 has 20 free cores, 30 asked" in resp.claims[uid].error
    assert snapshot(node) == before


async def test_too_many_claims_in_one_call_is_invalid_argument(node: DraNode):
    import grpc
    import pytest

    entries = [(NS, f"c{i}", f"{i:08d}-0000-0000-0000-000000000000") for i in range(257)]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await prepare(node, *entries)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 256" in (e.value.details() or "")


def test_a_claim_reserved_for_too_many_consumers_is_refused_before_it_is_read():
    import pytest

    from gpumgr.dra.claims import MAX_RESERVED, ClaimError, grant_from_claim
    from tests.dra.harness import inventory

    def claim(n: int) -> dict:
        ref = {"resource": "pods", "name": "p", "uid": "pod-uid"}
        result = {"driver": DRIVER, "pool": NODE, "device": "gpu-0", "request": "gpu"}
        return {"metadata": {"uid": "u1"},
                "status": {"allocation": {"devices": {"results": [result]}}, "reservedFor": [ref] * n}}

    def grant(c: dict):
        return grant_from_claim(c, namespace=NS, name="c", uid="u1", driver=DRIVER, pool=NODE,
                                inventory=inventory())

    assert grant(claim(MAX_RESERVED)).devices[0].index == 0
    with pytest.raises(ClaimError, match="reservedFor must be a list of at most"):
        grant(claim(MAX_RESERVED + 1))
    with pytest.raises(ClaimError, match="reservedFor must be a list"):
        grant({**claim(1), "status": {**claim(1)["status"], "reservedFor": {"not": "a list"}}})


async def test_recovery_lists_claims_in_pages_and_refuses_a_cluster_too_large(node: DraNode, monkeypatch):
    from gpumgr.dra import kubeaccess
    from gpumgr.dra.kubeaccess import DraKube

    for i in range(5):
        node.create_claim(f"page-{i}", [share_request()])
    kube = DraKube(node.api_client)
    monkeypatch.setattr(kubeaccess, "LIST_PAGE", 2)
    names = sorted(c["metadata"]["name"] for c in await kube.list_claims())
    assert names == [f"page-{i}" for i in range(5)]
    monkeypatch.setattr(kubeaccess, "MAX_CLAIMS", 3)
    with pytest.raises(ValueError, match="more than 3 ResourceClaims"):
        await kube.list_claims()
