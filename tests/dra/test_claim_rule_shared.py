"""The scheduler extender (gpumgr.requests.claim_results.driver_results: what it counts on a node) and the node agent
(gpumgr.dra.claims.grant_from_claim: what it grants and enforces) read a claim's allocation by one rule: fed the
same claims, good and malformed, they agree on whether the claim takes anything and on the cards, cores and
memory it takes.

Out of scope here, as only the node's inventory can answer them: a pool that is another node's, a card index the
node does not have, more memory than the card has (the extender checks the last two against the node's published
shape: tests/extender/test_dra_claims.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpumgr.dra.claims import ClaimError, grant_from_claim
from gpumgr.requests.claim_results import driver_results
from tests.dra.harness import CARD_MIB, NODE, inventory

DRIVER = "vgpu.gpumgr.io"
GI, MI = 2**30, 2**20


def result(device: Any = "gpu-0", **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device, **extra}


def consumed(value: Any) -> dict[str, Any]:
    return result(consumedCapacity=value)


def claim_with(status: Any) -> dict[str, Any]:
    return {"metadata": {"uid": "u1", "name": "c", "namespace": "ns"}, "status": status}


def allocated(results: Any) -> dict[str, Any]:
    return claim_with({"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]})


RESULTS: list[Any] = [
    # consumedCapacity: absent, empty, real quantities, quantities of odd forms, wrong types, out of range
    [result()], [consumed(None)], [consumed({})],
    [consumed({"memory": "1Gi", "cores": "30"})], [consumed({"memory": "512Mi"})], [consumed({"cores": "50"})],
    [consumed({"memory": "0.5", "cores": "0.5"})], [consumed({"memory": "1.5Gi", "cores": "99.1"})],
    [consumed({"memory": 2 * GI, "cores": 30})], [consumed({"memory": 1.5, "cores": 7.0})],
    [consumed({"memory": "1e9"})], [consumed({"memory": "16Gi"})], [consumed({"memory": "4096Ki", "cores": "1"})],
    [consumed({"memory": "lots"})], [consumed({"cores": "30%"})], [consumed({"memory": True})],
    [consumed({"cores": False})], [consumed({"memory": None})], [consumed({"memory": [1]})],
    [consumed({"cores": {"value": 30}})], [consumed({"memory": float("nan")})], [consumed({"cores": "1e400"})],
    [consumed({"cores": "101"})], [consumed({"cores": "0"})], [consumed({"cores": "-5"})],
    [consumed({"memory": "0"})], [consumed({"memory": "-1Gi"})], [consumed({"memory": "x" * 10_000})],
    [consumed("8Gi")], [consumed([])], [consumed(["memory"])], [consumed(0)], [consumed("")],
    # the device and pool of a result
    [result("card-0")], [result(3)], [result("gpu-")], [result("gpu-01x")], [result(None)],
    [result("gpu-²")], [result("gpu-٣")], [result("gpu-1234567")],
    [result(pool=5)], [result(pool="")], [result(pool=None)],
    # several results, other drivers
    [result("gpu-0", consumedCapacity={"cores": "30"}), result("gpu-1", consumedCapacity={"memory": "2Gi"})],
    [result("gpu-0"), {**result("gpu-1"), "driver": "gpu.example.com"}],
    [{**result("gpu-0"), "driver": "gpu.example.com"}],
    [result("gpu-0"), consumed({"cores": "lots"})],
    [result("gpu-0"), "x"], [result()] * 32, [result()] * 33,
    [], None, "all", {"gpu-0": {}},
]

STATUSES: list[Any] = [
    None, {}, "allocated", ["x"], {"allocation": None}, {"allocation": "yes"}, {"allocation": {}},
    {"allocation": {"devices": None}}, {"allocation": {"devices": ["x"]}}, {"allocation": {"devices": "all"}},
]


def node_view(claim: dict[str, Any]) -> list[tuple[int, int, int]] | None:
    """(card, cores, MiB) of each device the node grants, or None when it refuses the claim."""
    try:
        grant = grant_from_claim(claim, namespace="ns", name="c", uid="u1", driver=DRIVER, pool=NODE,
                                 inventory=inventory())
    except ClaimError:
        return None
    return [(d.index, d.cores, d.memory_mib) for d in grant.devices]


def extender_view(claim: dict[str, Any]) -> list[tuple[int, int, int]] | None:
    """The same, as the extender counts it (an absent memory is the whole card), None when it counts nothing."""
    results = driver_results(claim, DRIVER)
    if not results:
        return None
    return [(r.index, r.cores, CARD_MIB if r.memory_mib is None else r.memory_mib) for r in results]


CLAIMS = [allocated(r) for r in RESULTS] + [claim_with(s) for s in STATUSES]


@pytest.mark.parametrize("claim", CLAIMS, ids=[f"claim-{i}" for i in range(len(CLAIMS))])
def test_the_extender_counts_what_the_node_grants(claim: dict[str, Any]):
    assert extender_view(claim) == node_view(claim)


def test_the_rule_grants_and_refuses_what_it_should():
    """The agreement above is not agreement on nothing: the expected amounts for a few claims."""
    views = {i: node_view(c) for i, c in enumerate(CLAIMS)}
    assert sum(v is not None for v in views.values()) >= 15
    assert node_view(allocated([result()])) == [(0, 100, CARD_MIB)]
    assert node_view(allocated([consumed({"memory": "1Gi", "cores": "30"})])) == [(0, 30, 1024)]
    assert node_view(allocated([consumed({"memory": "512Mi"})])) == [(0, 100, 512)]
    assert node_view(allocated([consumed({"memory": "0.5", "cores": "0.5"})])) == [(0, 1, 1)]  # rounded up
    assert node_view(allocated([consumed({"memory": "1.5Gi", "cores": "99.1"})])) == [(0, 100, 1536)]
    bads: tuple[Any, ...] = ({"memory": True}, {"memory": None}, {"cores": "101"}, {"memory": "0"}, "8Gi", [])
    for bad in bads:
        assert node_view(allocated([consumed(bad)])) is None, bad
    assert node_view(allocated([result("gpu-0"), {**result("gpu-1"), "driver": "gpu.example.com"}])) \
        == [(0, 100, CARD_MIB)]


@pytest.mark.parametrize(("claim", "message"), [
    (allocated([consumed({"memory": "lots"})]), "consumedCapacity: not a quantity: 'lots'"),
    (allocated([consumed({"cores": "101"})]), "consumedCapacity cores 101 is outside 1..100"),
    (allocated([consumed("8Gi")]), "consumedCapacity must be an object"),
    (allocated([result("card-0")]), "device 'card-0' in pool dra-node is not a GPU of this driver"),
    (allocated([result(pool="x" * 300)]), "is not a node name"),
    (allocated([consumed({"memory": "17Gi"})]), f"outside 1..{CARD_MIB * MI}"),
    (allocated([result()] * 33), "must be a list of at most 32"),
    (allocated([result(), "x"]), "a result in status.allocation.devices.results is not an object"),
    (claim_with(["x"]), "status must be an object"),
    (claim_with({"allocation": "yes"}), "status.allocation must be an object"),
    (claim_with({"allocation": {"devices": ["x"]}}), "status.allocation.devices must be an object"),
    (claim_with({}), "is not allocated"),
    ({"metadata": "u1", "status": {}}, "UID mismatch"),
])
def test_the_node_says_what_is_wrong(claim: dict[str, Any], message: str):
    with pytest.raises(ClaimError, match="^claim ns/c") as e:
        grant_from_claim(claim, namespace="ns", name="c", uid="u1", driver=DRIVER, pool=NODE, inventory=inventory())
    assert message in str(e.value)
    assert len(str(e.value)) < 400
