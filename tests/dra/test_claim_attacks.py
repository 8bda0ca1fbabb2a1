"""Issue 18, not yet attacked: DRA claims through the real NodePrepareResources (unix-socket gRPC, the kubelet
emulator), with allocations someone forged or edited. Each bad claim gets its own clear error and changes nothing;
good claims in the same call are prepared."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from tests.dra.harness import NODE, NS, DraNode, whole_request
from tests.dra.test_bad_claims import allocate, prepare, results_patch, snapshot

CAPACITY_ATTACKS: dict[str, tuple[Any, str]] = {
    "larger-than-the-card": ({"memory": "64Gi", "cores": "30"}, "is outside 1..17179869184"),
    "zero-memory": ({"memory": "0", "cores": "30"}, "not a positive amount of memory"),
    "negative-memory": ({"memory": "-1Gi", "cores": "30"}, "not a positive amount of memory"),
    "not-a-number": ({"memory": "NaN", "cores": "30"}, "not a quantity: 'NaN'"),
    "exponent": ({"memory": "1e30", "cores": "30"}, "not a positive amount of memory"),
    "thousands-of-digits": ({"memory": "9" * 5000, "cores": "30"}, "not a quantity"),
    "unpublished-capacity": ({"memory": "4Gi", "cores": "30", "bananas": "1"},
                             "names 'bananas', which this driver does not publish (its devices have memory and cores)"),
    "zero-cores": ({"memory": "4Gi", "cores": "0"}, "cores 0 is outside 1..100"),
    "too-many-cores": ({"memory": "4Gi", "cores": "101"}, "cores 101 is outside 1..100"),
    "negative-cores": ({"memory": "4Gi", "cores": "-30"}, "cores -30 is outside 1..100"),
    "not-an-object": (["memory"], "consumedCapacity must be an object"),
}


@pytest.mark.parametrize("half", [0, 1])
async def test_forged_consumed_capacity_is_refused_per_claim_and_changes_nothing(node: DraNode, half: int) -> None:
    names = sorted(CAPACITY_ATTACKS)[half::2]  # two halves: one node holds ~12 claims of 5 cores and 1 GiB here
    claims = {name: allocate(node, name, cores=5, memory="1Gi") for name in [*names, "good"]}
    for name in names:  # edited after the scheduler placed them all
        node.api.store.merge_patch_object(
            "resourceclaims", name, results_patch(claims[name], consumedCapacity=CAPACITY_ATTACKS[name][0]), NS)
    before = snapshot(node)
    resp = await prepare(node, *[(NS, n, c["metadata"]["uid"]) for n, c in claims.items() if n != "good"])
    for name in names:
        got = resp.claims[claims[name]["metadata"]["uid"]]
        assert CAPACITY_ATTACKS[name][1] in got.error and not got.devices, (name, got.error)
        assert len(got.error) < 400, got.error
    assert snapshot(node) == before
    good = claims["good"]["metadata"]["uid"]
    resp = await prepare(node, (NS, "good", good))
    assert resp.claims[good].error == "" and resp.claims[good].devices


def _reserve_for(node: DraNode, claim: dict[str, Any], pods: int) -> None:
    status = copy.deepcopy(claim["status"])
    real = status["reservedFor"][:1]  # the scheduled pod, bound to this node, first
    status["reservedFor"] = real + [{"resource": "pods", "name": f"pod-{i}", "uid": f"uid-{i}"}
                                    for i in range(pods - len(real))]
    node.api.store.merge_patch_object("resourceclaims", claim["metadata"]["name"], {"status": status}, NS)


async def test_a_claim_reserved_for_256_pods(node: DraNode) -> None:
    share = allocate(node, "share", cores=5, memory="1Gi")
    node.create_claim("whole", [whole_request()])
    node.create_pod("pod-whole", {"gpu": {"resourceClaimName": "whole"}})
    node.scheduler.schedule_pod(NS, "pod-whole", [NODE])
    whole = node.claim("whole")
    _reserve_for(node, share, 256)
    _reserve_for(node, whole, 256)
    resp = await prepare(node, (NS, "share", share["metadata"]["uid"]), (NS, "whole", whole["metadata"]["uid"]))
    refused = resp.claims[share["metadata"]["uid"]].error
    # a limited claim serves one pod; the message names a few and counts the rest (it listed all 256 before)
    assert "shared by 256 pods (pod-share, pod-0, pod-1, pod-2, pod-3 and 251 more)" in refused, refused
    assert len(refused) < 500
    assert resp.claims[whole["metadata"]["uid"]].error == ""  # a whole card may be shared
    assert [d.device_name for d in resp.claims[whole["metadata"]["uid"]].devices] == ["gpu-1"]


async def test_a_prepared_claim_whose_allocation_changed_names_both_sets_of_devices(node: DraNode) -> None:
    """Issue 18 finding 7: the message printed an internal tuple, `([(6,)])`."""
    claim = allocate(node, "moved", cores=30, memory="4Gi")
    uid = claim["metadata"]["uid"]
    assert (await prepare(node, (NS, "moved", uid))).claims[uid].error == ""
    before = snapshot(node)
    node.api.store.merge_patch_object("resourceclaims", "moved", results_patch(claim, device="gpu-3"), NS)
    error = (await prepare(node, (NS, "moved", uid))).claims[uid].error
    assert ("is already prepared with other devices (gpu-0 (30 cores, 4096 MiB); the claim now names gpu-3 "
            "(30 cores, 4096 MiB)); unprepare it first") in error, error
    assert "(0,)" not in error
    assert snapshot(node) == before


# -- this driver's ResourceSlice edited or deleted by someone else --------------------------------------------------
SLICE = f"{NODE}-vgpu.gpumgr.io"


def _slice(node: DraNode) -> dict[str, Any] | None:
    return node.api.store.get_object("resourceslices", SLICE)


@pytest.mark.parametrize("edit", ["capacity", "devices", "node", "driver", "deleted"])
async def test_the_agent_puts_its_slice_back_and_says_why(node: DraNode, caplog: pytest.LogCaptureFixture,
                                                          edit: str) -> None:
    from tests.dra.test_slices import until

    caplog.set_level(logging.INFO, "gpumgr.dra.slices")
    await until(lambda: _slice(node) is not None)
    assert node.fe is not None
    await node.fe.publisher.publish()  # settled: what it wrote is what the API shows
    good = copy.deepcopy(_slice(node))
    assert good is not None
    store = node.api.store
    spec = copy.deepcopy(good["spec"])
    if edit == "capacity":
        spec["devices"][0]["capacity"]["cores"]["value"] = "1000"
    elif edit == "devices":
        spec["devices"] = spec["devices"][:1]
    elif edit == "node":
        spec["nodeName"] = "node-b"
    elif edit == "driver":
        spec["driver"] = "gpu.example.com"
    if edit == "deleted":
        store.delete_object("resourceslices", SLICE)
    else:
        store.merge_patch_object("resourceslices", SLICE, {"spec": spec})
    caplog.clear()
    assert await node.fe.publisher.publish()
    back = _slice(node)
    assert back is not None
    assert back["spec"]["devices"] == good["spec"]["devices"]
    assert (back["spec"]["driver"], back["spec"]["nodeName"]) == (good["spec"]["driver"], NODE)
    said = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "by someone else" in said and SLICE in said, said


# -- thousands of claims on one node ---------------------------------------------------------------------------------
def _forged_claim(node: DraNode, name: str, device: str, pod_node: str = NODE) -> dict[str, Any]:
    """A claim created with its allocation already in its status (as a scheduler, or someone with write access to
    claims' status, would leave it): one share of `device`, 1 core and 256 MiB, reserved for a pod bound to
    `pod_node`."""
    pod = node.api.store.create_pod({"metadata": {"name": f"pod-{name}", "namespace": NS},
                                     "spec": {"containers": [{"name": "main", "image": "cuda"}]}})
    node.api.store.bind_pod(NS, f"pod-{name}", pod_node)
    result = {"request": "gpu", "driver": "vgpu.gpumgr.io", "pool": NODE, "device": device, "shareID": name,
              "consumedCapacity": {"memory": "256Mi", "cores": "1"}}
    return node.api.store.create_object("resourceclaims", {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.gpumgr.io"}}]}},
        "status": {"allocation": {"devices": {"results": [result]}},
                   "reservedFor": [{"resource": "pods", "name": f"pod-{name}",
                                    "uid": pod["metadata"]["uid"]}]}}, NS)


async def test_two_thousand_claims_on_one_node_fill_it_and_the_rest_are_refused_one_by_one(node: DraNode) -> None:
    claims = [_forged_claim(node, f"c{i:04d}", f"gpu-{i % 4}") for i in range(2000)]
    errors: dict[str, str] = {}
    for start in range(0, len(claims), 256):  # the kubelet sends at most 256 claims a call
        batch = claims[start:start + 256]
        resp = await prepare(node, *[(NS, c["metadata"]["name"], c["metadata"]["uid"]) for c in batch])
        for c in batch:
            errors[c["metadata"]["name"]] = resp.claims[c["metadata"]["uid"]].error
    prepared = [n for n, e in errors.items() if not e]
    # 4 cards of 16 GiB: 64 shares of 256 MiB each; every other claim refused with the reason, nothing half-done
    assert len(prepared) == 256
    refused = [e for e in errors.values() if e]
    assert all("does not fit on node dra-node" in e for e in refused), refused[:3]
    assert len(node.dra_allocations()) == 256
    assert len(list(node.cfg.cdi_dir.glob("*"))) == 256


# -- a claim whose pods are on another node --------------------------------------------------------------------------
async def test_a_claim_reserved_only_for_a_pod_on_another_node_is_refused(node: DraNode) -> None:
    """Allocated on this node's pool, but its pod is bound to node-b: this node prepares nothing for it (it did)."""
    claim = _forged_claim(node, "elsewhere", "gpu-0", pod_node="node-b")
    uid = claim["metadata"]["uid"]
    before = snapshot(node)
    error = (await prepare(node, (NS, "elsewhere", uid))).claims[uid].error
    assert ("claim default/elsewhere is reserved only for pods that are not on this node dra-node: "
            "pod-elsewhere (on node node-b); a node prepares claims for its own pods only") in error, error
    assert snapshot(node) == before


async def test_a_claim_for_a_missing_pod_or_a_pod_of_the_same_name_but_another_uid_is_refused(node: DraNode) -> None:
    claim = _forged_claim(node, "gone", "gpu-0")
    uid = claim["metadata"]["uid"]
    node.api.store.delete_pod(NS, "pod-gone")
    before = snapshot(node)
    error = (await prepare(node, (NS, "gone", uid))).claims[uid].error
    assert "pod-gone (not found)" in error, error
    node.api.store.create_pod({"metadata": {"name": "pod-gone", "namespace": NS},  # same name, a new pod
                               "spec": {"containers": [{"name": "main", "image": "cuda"}]}})
    node.api.store.bind_pod(NS, "pod-gone", NODE)
    error = (await prepare(node, (NS, "gone", uid))).claims[uid].error
    assert "pod-gone (not found)" in error, error
    assert snapshot(node) == before


async def test_a_shared_claim_with_one_pod_here_is_prepared(node: DraNode) -> None:
    """One consumer on this node is enough: the others may run elsewhere (a whole card shared across pods)."""
    node.create_claim("shared", [whole_request()])
    node.create_pod("pod-here", {"gpu": {"resourceClaimName": "shared"}})
    node.scheduler.schedule_pod(NS, "pod-here", [NODE])
    claim = node.claim("shared")
    other = _forged_claim(node, "other", "gpu-1", pod_node="node-b")  # only for its bound pod on node-b
    status = copy.deepcopy(claim["status"])
    status["reservedFor"] = other["status"]["reservedFor"] + status["reservedFor"]
    node.api.store.merge_patch_object("resourceclaims", "shared", {"status": status}, NS)
    uid = claim["metadata"]["uid"]
    resp = await prepare(node, (NS, "shared", uid))
    assert resp.claims[uid].error == "" and resp.claims[uid].devices


async def test_a_pod_in_the_agents_pod_cache_needs_no_api_read(node: DraNode) -> None:
    """The pod cache of this node's pods answers first: a claim whose pod the cache holds is prepared even when
    the pod cannot be read from the API (here: deleted there, still in the cache)."""
    claim = _forged_claim(node, "cached", "gpu-0")
    pod = node.api.store.get_pod(NS, "pod-cached")
    assert pod is not None and node.fe is not None
    node.api.store.delete_pod(NS, "pod-cached")
    uid = claim["metadata"]["uid"]
    assert "pod-cached (not found)" in (await prepare(node, (NS, "cached", uid))).claims[uid].error
    node.fe.preparer.cached_pod = {pod["metadata"]["uid"]: pod}.get
    resp = await prepare(node, (NS, "cached", uid))
    assert resp.claims[uid].error == "" and resp.claims[uid].devices


@pytest.mark.parametrize("share", ["s" * 5000, "a b", {"nested": "object"}])
async def test_a_whole_card_claim_s_share_id_that_is_not_a_dns_label_is_refused(node: DraNode, share: object) -> None:
    """The rule of the MIG path (gpumgr.requests.claim_results.share_id) on the card path too: before, any shareID
    was taken as str() of it, of any length, into the ledger's claim holder."""
    claim = _forged_claim(node, "odd-share", "gpu-0")
    uid = claim["metadata"]["uid"]
    node.api.store.merge_patch_object("resourceclaims", "odd-share", results_patch(claim, shareID=share), NS)
    before = snapshot(node)
    error = (await prepare(node, (NS, "odd-share", uid))).claims[uid].error
    assert "claim default/odd-share: device 'gpu-0': shareID" in error and "is not a DNS label" in error, error
    assert len(error) < 400 and snapshot(node) == before
