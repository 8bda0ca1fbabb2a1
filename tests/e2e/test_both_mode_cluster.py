"""`both` mode across a cluster: gpu-manager pods placed by the scheduler extender (`--dra-claims on`) and DRA
claims allocated by the scheduler stand-in share the cards of nodes whose agents serve both, and no card is ever
booked past its 100 cores or its memory -- by the API objects, by each agent's ledger, by the extender's view.

Everything speaks its real protocol: the extender's filter/prioritize/bind over HTTP, the kubelet emulator's
Allocate/PreStartContainer and the DRA kubelet emulator's NodePrepareResources over unix-socket gRPC, the agents'
ResourceSlices and the claims' allocations through the Kubernetes API test server."""

from __future__ import annotations

import pytest

from gpumgr.requests import podspec
from gpumgr.sim.dra_scheduler import Unschedulable
from gpumgr.sim.kubelet.admission import AdmissionError
from gpumgr.sim.kubelet.dra_kubelet import DraPrepareError
from tests.e2e.both_cluster import CARD_MIB, NS, CardUse, Cluster, NodeDef, both_cluster, until

A, B = "node-a", "node-b"
# node-a's minors run backwards (card index 0 is /dev/nvidia1): DRA names cards by index, the extender's
# annotations by minor, and the two must still mean the same card
DEFS = (NodeDef(A, (1, 0)), NodeDef(B, (0, 1)))


def minor_of(c: Cluster, node: str, device: str) -> int:
    return c.nodes[node].sim.inventory.gpus[int(device.removeprefix("gpu-"))].minor


def predicate_minor(c: Cluster, pod: str) -> int:
    return int(podspec.pod_annotations(c.pod(pod))[f"{podspec.ANN_PREDICATE_IDX}0"])


def ledger_keys(c: Cluster, node: str, index: int) -> set[str]:
    return set(c.ledger(node).card(index).holders)


def cores_shown(c: Cluster, node: str, device: str) -> str | None:
    d = c.slice_device(node, device)
    return None if d is None else str(d["capacity"]["cores"]["value"])


def assert_no_card_overbooked(c: Cluster) -> dict[tuple[str, int], CardUse]:
    from_api = c.usage_from_api()
    assert from_api == c.usage_from_ledgers(), "the API objects and the agents' ledgers disagree"
    assert from_api == c.usage_from_extender(), "the API objects and the extender's view disagree"
    for (node, index), use in from_api.items():
        assert use.cores <= 100, f"{node} gpu-{index} holds {use.cores} cores"
        assert use.memory_mib <= CARD_MIB, f"{node} gpu-{index} holds {use.memory_mib} MiB"
    return from_api


async def test_claims_and_gpu_manager_pods_share_cards_without_double_booking() -> None:
    async with both_cluster(DEFS) as c:
        # -- DRA claims first: 60 cores + 8 GiB on each card of node-a, 30 cores + 12 GiB on node-b's gpu-0 ------
        assert await c.run_claim([A], "train-a", 60, "8Gi") == (A, "gpu-0")
        assert await c.run_claim([A], "train-b", 60, "8Gi") == (A, "gpu-1")
        assert await c.run_claim([B], "infer", 30, "12Gi") == (B, "gpu-0")
        for name, node, index in (("train-a", A, 0), ("train-b", A, 1), ("infer", B, 0)):
            uid = c.claim(name)["metadata"]["uid"]
            assert ledger_keys(c, node, index) == {f"dra/{uid}/0"}, "NodePrepareResources put it in the ledger"
        ext = c.extender
        await until(lambda: len(ext.view.claims_on(A)) == 2 and len(ext.view.claims_on(B)) == 1,
                    "the extender to count the three claims")

        # -- the extender places gpu-manager pods around them --------------------------------------------------
        # a whole card: node-a has none left (60 cores taken on each), node-b's gpu-1 is free
        whole = await c.place("gm-whole", 100, 0)
        assert whole.node == B, whole.reasons
        assert A in whole.reasons, whole.reasons
        assert predicate_minor(c, "gm-whole") == minor_of(c, B, "gpu-1")
        admitted = await c.admit("gm-whole")
        assert c.visible_minors("gm-whole", admitted) == [minor_of(c, B, "gpu-1")]

        # 50 cores + 4 GiB: only node-b's gpu-0 has them (70 cores and exactly 4 GiB left beside the claim)
        half = await c.place("gm-half", 50, 16)
        assert half.node == B, half.reasons
        assert "needs 50 cores" in half.reasons[A], half.reasons
        assert predicate_minor(c, "gm-half") == minor_of(c, B, "gpu-0")
        admitted = await c.admit("gm-half")
        assert c.visible_minors("gm-half", admitted) == [minor_of(c, B, "gpu-0")]
        assert len(ledger_keys(c, B, 0)) == 2  # the claim and the pod, on one card of one ledger

        # another 50: nowhere (40 cores left on node-a's cards, 20 on node-b's gpu-0, gpu-1 whole)
        nowhere = await c.place("gm-nowhere", 50, 4)
        assert nowhere.node is None and set(nowhere.reasons) == {A, B}, nowhere.reasons
        assert not c.pod("gm-nowhere")["spec"].get("nodeName")

        # 40 cores + 2 GiB fit beside a 60-core claim on node-a; the node gives exactly the card chosen
        forty = await c.place("gm-forty", 40, 8)
        assert forty.node == A, forty.reasons
        chosen = predicate_minor(c, "gm-forty")
        admitted = await c.admit("gm-forty")
        assert c.visible_minors("gm-forty", admitted) == [chosen]
        full = next(g.index for g in c.nodes[A].sim.inventory.gpus if g.minor == chosen)
        other = 1 - full
        assert len(ledger_keys(c, A, full)) == 2

        # -- the other way round: the slices leave out what the pods hold, so the stand-in cannot over-book ----
        await until(lambda: cores_shown(c, B, "gpu-0") == "50" and cores_shown(c, B, "gpu-1") is None
                    and cores_shown(c, A, f"gpu-{full}") == "60",
                    "the slices to show what the gpu-manager pods leave")
        # 50 cores: node-a has 0 and 40 left for claims, node-b's gpu-0 50 - 30 = 20; nothing is written
        with pytest.raises(Unschedulable):
            await c.run_claim([A, B], "wide", 50, "1Gi")
        assert not c.claim("wide").get("status", {}).get("allocation")
        assert not c.pod("wide-pod")["spec"].get("nodeName")
        # node-b's gpu-0 has cores left but no memory (12 GiB claimed + 4 GiB held by gm-half)
        with pytest.raises(Unschedulable):
            await c.run_claim([B], "no-memory", 10, "1Gi")
        assert not c.claim("no-memory").get("status", {}).get("allocation")
        # 40 cores + 8 GiB still fit on node-a's other card; the node prepares it
        assert await c.run_claim([B, A], "fits", 40, "8Gi") == (A, f"gpu-{other}")
        assert len(ledger_keys(c, A, other)) == 2

        # the extender counts that late claim too: node-a is full, node-b's gpu-0 has cores but no memory
        await until(lambda: len(ext.view.claims_on(A)) == 3, "the extender to count the late claim")
        late = await c.place("gm-late", 10, 1)
        assert late.node is None and set(late.reasons) == {A, B}, late.reasons

        # -- the sums: every card within 100 cores and its memory, read three ways that agree -------------------
        usage = assert_no_card_overbooked(c)
        assert usage[(A, full)] == CardUse(100, 8192 + 8 * 256)
        assert usage[(A, other)] == CardUse(100, 16384)
        assert usage[(B, 0)] == CardUse(80, 16384)
        assert usage[(B, 1)] == CardUse(100, CARD_MIB)


X, Y = "race-x", "race-y"


def held(c: Cluster, node: str) -> dict[str, tuple[int, int]]:
    """Ledger key -> (cores, MiB) on the node's only card, as its agent holds them."""
    return {k: (h.cores, h.memory_mib) for k, h in c.ledger(node).card(0).holders.items()}


async def test_when_the_two_schedulers_race_the_node_decides_and_never_overbooks() -> None:
    """The DRA scheduler sees a gpu-manager pod only once the node has admitted it (the slice follows the
    ledger); the extender sees a claim as soon as it is allocated. A claim allocated from a cache older than
    the extender's bind over-commits the card in the API; the node grants whichever comes first and refuses the
    other with a clear error, so no ledger is ever over-booked; once the loser goes, every reading agrees."""
    async with both_cluster((NodeDef(X, (0,)), NodeDef(Y, (0,)))) as c:
        cache = c.stale_cache()  # the DRA scheduler's view before the binds below
        assert (await c.place("gm-x", 60, 8, [X])).node == X
        assert (await c.place("gm-y", 60, 8, [Y])).node == Y
        assert c.allocate_claim_from(cache, X, "claim-x", 50, "2Gi") == "gpu-0"
        assert c.allocate_claim_from(cache, Y, "claim-y", 50, "2Gi") == "gpu-0"
        assert c.usage_from_api()[(X, 0)].cores == 110  # both schedulers said yes

        # on race-x the claim's pod starts first: the node prepares it and refuses the gpu-manager pod
        await c.prepare_claim(X, "claim-x")
        with pytest.raises(AdmissionError, match="RESOURCE_EXHAUSTED.*card 0 has 50 free cores, 60 asked"):
            await c.admit("gm-x")
        uid_x = c.claim("claim-x")["metadata"]["uid"]
        assert held(c, X) == {f"dra/{uid_x}/0": (50, 2048)}

        # on race-y the gpu-manager pod starts first: the node admits it and refuses to prepare the claim
        await c.admit("gm-y")
        with pytest.raises(DraPrepareError, match="does not fit on node race-y"):
            await c.prepare_claim(Y, "claim-y")
        assert list(held(c, Y).values()) == [(60, 8 * 256)]

        # the losers go: the pod refused at admission fails, the refused claim's pod is deleted (deallocated)
        c.api.store.set_pod_phase(NS, "gm-x", "Failed")
        c.drop_claim_pod("claim-y")
        await until(lambda: c.usage_from_api() == c.usage_from_extender() == c.usage_from_ledgers(),
                    "the API, the extender and the agents to agree")
        assert assert_no_card_overbooked(c) == {(X, 0): CardUse(50, 2048), (Y, 0): CardUse(60, 2048)}


async def test_the_extender_keeps_counting_a_running_pod_over_a_claim_the_node_refused() -> None:
    async with both_cluster((NodeDef(X, (0,)),)) as c:
        cache = c.stale_cache()
        assert (await c.place("gm", 60, 8)).node == X
        c.allocate_claim_from(cache, X, "late", 50, "2Gi")  # over-commits gpu-0 in the API: 110 cores
        await c.admit("gm")  # the node runs the pod ...
        with pytest.raises(DraPrepareError):
            await c.prepare_claim(X, "late")  # ... and refuses the claim

        def seen_running() -> bool:  # the extender has the agent's annotation patch (the pod is assigned)
            pod = c.extender.view.pod(NS, "gm") or {}
            return podspec.pod_annotations(pod).get(podspec.ANN_ASSIGNED) == "true"
        await until(seen_running, "the extender to see the admitted pod")

        # 40 cores are free on the node; a 50-core pod must not be placed there
        again = await c.place("gm-more", 50, 4)
        assert again.node is None, f"placed on a card the running pod holds 60 of: {held(c, X)}"
