"""The extender places pods asking MIG instances (`nvidia.com/mig-<profile>`, the device plugins' static layout) by
what each node's agent publishes in its inventory annotation (`"mig"`: profiles, placements, instances), counts the
pods bound there, and names the missing profile and, per card, why no placement of it is free. In `both` mode a DRA
claim holding a MIG device counts against its card: no vcuda pod goes there, and its placement is taken. Through the
extender's HTTP API, with nodes, pods and claims in the API test server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpumgr.mig.profiles import FAMILIES
from gpumgr.node import inventory as node_inventory
from gpumgr.node.mig_inventory import MigCardView, MigInstanceView, MigProfileView, NodeMig
from gpumgr.sim.kubeapi import KubeApiServer, KubeStore
from tests.extender.support import args, assert_a_relist_frees_the_node, eventually, inventory, node, pod

DRIVER = "vgpu.gpumgr.io"
A100 = "NVIDIA A100-SXM4-80GB"
MEM = 81920
ONE = "nvidia.com/mig-1g.10gb"
THREE = "nvidia.com/mig-3g.40gb"
FOUR = "nvidia.com/mig-4g.40gb"


def profiles() -> tuple[MigProfileView, ...]:
    return tuple(MigProfileView(name=p.name, id=p.id, slices=p.slices, memory_slices=p.memory_slices,
                                max_count=p.max_count, starts=p.starts) for p in FAMILIES["a100-80"].profiles(MEM))


def mig_card(index: int, instances: list[tuple[str, int, int]], origin: str = "layout") -> MigCardView:
    return MigCardView(index=index, compute_slices=7, memory_slices=8, profiles=profiles(),
                       instances=tuple(MigInstanceView(profile=p, start=s, size=n, origin=origin)
                                       for p, s, n in instances))


def mig_node(name: str, cards: list[MigCardView], count: int = 2) -> dict[str, Any]:
    """A node of `count` A100-80GB cards, those in `cards` in MIG mode (published unhealthy, as the agent does)."""
    inv = inventory(count, model=A100, memory_mib=MEM)
    mig = NodeMig(prefix="nvidia.com/mig-", cards=tuple(cards))
    text = node_inventory.encode(inv, frozenset(c.index for c in cards), 256, mig)
    return node(name, None, annotation=text)


def mig_pod(name: str, asks: dict[str, int | str], node_name: str | None = None, vcuda: tuple[int, int] = (0, 0),
            phase: str | None = None) -> dict[str, Any]:
    p = pod(name, [vcuda], node=node_name, phase=phase)
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    limits.update({k: str(v) for k, v in asks.items()})
    p["spec"]["containers"][0]["resources"]["requests"] = dict(limits)
    return p


SEVEN_ONES = [("1g.10gb", s, 1) for s in range(7)]


async def filtered(ext: Any, p: dict[str, Any], nodes: list[str]) -> tuple[list[str], dict[str, str]]:
    """The nodes that pass, and the reasons of those that do not (failed, or failed and unresolvable)."""
    doc = await ext.filter(args(p, nodes))
    return doc["NodeNames"] or [], {**(doc["FailedNodes"] or {}), **(doc.get("FailedAndUnresolvableNodes") or {})}


async def test_a_node_without_the_profile_fails_and_the_reason_names_profile_and_placements(
        api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(mig_node("ones", [mig_card(0, SEVEN_ONES)]))
    s.create_node(mig_node("threes", [mig_card(0, [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)])]))
    s.create_node(node("plain", inventory(2)))
    ext = await start_extender()

    passed, failed = await filtered(ext, s.create_pod(mig_pod("one", {ONE: 1})), ["ones", "threes", "plain"])
    assert passed == ["ones"], failed
    assert "no 1g.10gb instance" in failed["threes"], failed
    # the card's placements are all taken by the two 3g instances: the reason says where
    assert "card 0: no free 1g.10gb placement" in failed["threes"], failed
    assert "3g.40gb at memory slices 0-3" in failed["threes"], failed
    assert "no MIG-enabled card" in failed["plain"], failed

    passed, failed = await filtered(ext, s.create_pod(mig_pod("three", {THREE: 2})), ["ones", "threes"])
    assert passed == ["threes"], failed
    assert "card 0: no free 3g.40gb placement" in failed["ones"], failed


async def test_pods_bound_to_a_node_hold_its_instances(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(mig_node("n", [mig_card(0, SEVEN_ONES[:3])]))
    for k in range(2):
        s.create_pod(mig_pod(f"run{k}", {ONE: 1}, node_name="n"))
    s.create_pod(mig_pod("done", {ONE: 1}, node_name="n", phase="Succeeded"))  # finished: holds nothing
    ext = await start_extender()

    assert (await filtered(ext, s.create_pod(mig_pod("fits", {ONE: 1})), ["n"]))[0] == ["n"]
    two = s.create_pod(mig_pod("two", {ONE: 2}))
    passed, failed = await filtered(ext, two, ["n"])
    assert passed == [] and "2 asked, 1 of the node's 3 1g.10gb instances free" in failed["n"], failed
    # free placements are named: the layout could make more 1g.10gb there
    assert "card 0: 1g.10gb placements 3,4,5,6 are free" in failed["n"], failed

    s.delete_pod("default", "run0")
    assert await eventually(lambda: _passes(ext, two, ["n"]))


async def test_a_pod_asking_only_mig_instances_is_bound_as_it_is(api: KubeApiServer, start_extender: Any) -> None:
    """With the profiles in the extender's managedResources (chart: agent.mig.extenderProfiles) kube-scheduler asks
    the extender to bind such a pod: a plain Binding, no annotation (the kubelet picks the instance)."""
    s = api.store
    s.create_node(mig_node("n", [mig_card(0, SEVEN_ONES)]))
    ext = await start_extender()
    p = s.create_pod(mig_pod("one", {ONE: 1}))
    assert await ext.bind(p, "n") == ""
    bound = s.get_pod("default", "one") or {}
    assert bound["spec"]["nodeName"] == "n"
    assert not [k for k in bound["metadata"].get("annotations") or {} if k.startswith("tencent.com/")]
    # and it holds one of the node's instances from then on
    p2 = s.create_pod(mig_pod("seven", {ONE: 7}))
    assert await eventually(lambda: _fails(ext, p2, "n"))


async def test_a_pod_asking_mig_and_vcuda_needs_both(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(mig_node("n", [mig_card(0, SEVEN_ONES)], count=2))  # card 1 shared
    s.create_node(mig_node("full", [mig_card(0, SEVEN_ONES), mig_card(1, SEVEN_ONES)], count=2))
    ext = await start_extender()
    p = s.create_pod(mig_pod("both", {ONE: 1}, vcuda=(50, 4)))
    passed, failed = await filtered(ext, p, ["n", "full"])
    assert passed == ["n"], failed
    assert "50 cores" in failed["full"], failed


async def test_a_claim_on_a_mig_device_counts_against_its_card(api: KubeApiServer, start_extender: Any) -> None:
    """`both` mode: claims made by kube-scheduler on the partitionable pool. A MIG claim on card 1 (not yet in MIG
    mode in the annotation) keeps a whole-card pod off it; a MIG claim on card 0 takes its placement."""
    s = api.store
    s.create_node(mig_node("n", [mig_card(0, [])], count=2))  # card 0 in MIG mode, no instance yet; card 1 free
    ext = await start_extender()
    whole = s.create_pod(pod("whole", [(100, 0)]))
    assert (await filtered(ext, whole, ["n"]))[0] == ["n"]

    s.create_object("resourceclaims", claim("c1", "n", "gpu-1-mig-3g-40gb-9-4"))
    s.create_object("resourceclaims", claim("c0", "n", "gpu-0-mig-3g-40gb-9-0"))
    assert await eventually(lambda: _fails(ext, whole, "n"))
    _passed, failed = await filtered(ext, whole, ["n"])
    assert "100 cores" in failed["n"] or "whole" in failed["n"], failed

    four = s.create_pod(mig_pod("four", {FOUR: 1}))
    overlap = "card 0: no free 4g.40gb placement (placements 0 overlap 3g.40gb at memory slices 0-3)"

    async def c0_counted() -> bool:  # c0 reaches the claim watch after c1 (whose effect the wait above saw)
        return overlap in (await filtered(ext, four, ["n"]))[1].get("n", "")

    assert await eventually(c0_counted), (await filtered(ext, four, ["n"]))[1]

    s.delete_object("resourceclaims", "c1", "team")  # card 1 is free again for whole-card pods
    assert await eventually(lambda: _passes(ext, whole, ["n"]))


async def test_an_unusable_mig_section_makes_the_node_unusable(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    good = json.loads(node_inventory.encode(inventory(1, model=A100, memory_mib=MEM), frozenset({0}), 256,
                                            NodeMig(prefix="nvidia.com/mig-", cards=(mig_card(0, SEVEN_ONES),))))
    good["mig"]["cards"][0]["instances"][0]["start"] = 99  # past the card's memory slices
    s.create_node(node("bad", None, annotation=json.dumps(good)))
    ext = await start_extender()
    _passed, failed = await filtered(ext, s.create_pod(mig_pod("one", {ONE: 1})), ["bad"])
    assert "mig.cards[0].instances[0].start" in failed["bad"], failed


async def test_a_bad_mig_quantity_is_a_400(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(mig_node("n", [mig_card(0, SEVEN_ONES)]))
    ext = await start_extender()
    status, doc = await ext.post("filter", args(mig_pod("half", {ONE: "500m"}), ["n"]))
    assert status == 400 and ONE in doc["Error"] and "whole-number" in doc["Error"], doc


async def test_a_relist_forgets_pods_deleted_while_the_watch_was_down(tmp_path: Path) -> None:
    store = KubeStore(history_size=2)
    store.create_node(mig_node("n", [mig_card(0, SEVEN_ONES[:1])]))
    store.create_pod(mig_pod("holder", {ONE: 1}, node_name="n"))
    p = store.create_pod(mig_pod("want", {ONE: 1}))
    await assert_a_relist_frees_the_node(tmp_path, store, p, "holder")


def claim(name: str, node_name: str, device: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.gpumgr.io"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "mig", "driver": DRIVER, "pool": node_name, "device": device}]}}}}


async def _passes(ext: Any, p: dict[str, Any], nodes: list[str]) -> bool:
    return (await filtered(ext, p, nodes))[0] == nodes


async def _fails(ext: Any, p: dict[str, Any], name: str) -> bool:
    return name in (await filtered(ext, p, [name]))[1]


async def test_shared_replicas_are_left_to_kube_schedulers_count(api: KubeApiServer, start_extender: Any) -> None:
    """`nvidia.com/mig-<profile>.shared` (replicas of an instance served as shares, docs/mig.md) is counted by
    kube-scheduler from the node's allocatable: the extender never refuses a node for it, not even one whose
    instances are all asked whole, and a pod asking replicas and a vcuda share must still fit the vcuda part."""
    s = api.store
    s.create_node(mig_node("shared", [mig_card(0, SEVEN_ONES)], count=1))
    s.create_node(node("plain", inventory(2)))
    s.create_pod(mig_pod("whole", {ONE: 7}, node_name="shared", phase="Running"))
    ext = await start_extender()
    passed, failed = await filtered(ext, s.create_pod(mig_pod("replica", {ONE + ".shared": 1})), ["shared", "plain"])
    assert passed == ["shared", "plain"], failed
    passed, failed = await filtered(ext, s.create_pod(mig_pod("both", {ONE + ".shared": 1}, vcuda=(30, 4))),
                                    ["shared", "plain"])
    assert passed == ["plain"] and "shared" in failed, failed
