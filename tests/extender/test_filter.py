"""Filter over HTTP, with scheduler-shaped payloads, on clusters seeded in the API test server."""

from __future__ import annotations

from typing import Any

from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import A100, T4, args, args_nodes, holding, inventory, node, pod


def verdict(doc: dict[str, Any]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    return doc["NodeNames"], doc["FailedNodes"], doc["FailedAndUnresolvableNodes"]


async def test_two_half_free_cards_are_refused_where_one_card_fits(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("half", inventory(2)))  # 100 free cores in sum: what kube-scheduler sees
    s.create_node(node("room", inventory(1)))
    s.create_pod(holding("h0", "half", [(50, 8, [0])]))
    s.create_pod(holding("h1", "half", [(50, 8, [1])]))
    s.create_pod(holding("r0", "room", [(30, 8, [0])]))
    p = s.create_pod(pod("want", [(60, 16)]))
    ext = await start_extender()

    passed, failed, never = verdict(await ext.filter(args(p, ["half", "room"])))

    assert passed == ["room"]
    assert never == {}
    assert "needs 60 cores and 4096 MiB on one card" in failed["half"]
    assert "50 free cores" in failed["half"]


async def test_cards_are_named_by_minor_not_by_position(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(2, minors=[4, 5])))
    s.create_pod(holding("busy", "n", [(100, 0, [5])]))  # /dev/nvidia5 = the second card
    one = s.create_pod(pod("one", [(100, 0)]))
    two = s.create_pod(pod("two", [(200, 0)]))
    ext = await start_extender()

    assert verdict(await ext.filter(args(one, ["n"])))[0] == ["n"]
    passed, failed, _ = verdict(await ext.filter(args(two, ["n"])))
    assert passed == []
    assert "needs 2 free whole cards; 1 of the node's 2 cards is free (1 in use, 0 unhealthy)" in failed["n"]


async def test_model_selection_by_annotations(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("a100", inventory(4, model=A100)))
    s.create_node(node("t4", inventory(4, model=T4, memory_mib=15360)))
    s.create_node(node("mixed", inventory(4, models=[A100, A100, T4, T4])))
    s.create_pod(holding("full-a", "mixed", [(200, 0, [0, 1])]))
    want_a100 = s.create_pod(pod("a", [(30, 4)], annotations={podspec.ANN_GPU_MODEL: "h100, a100"}))
    no_t4 = s.create_pod(pod("b", [(30, 4)], annotations={podspec.ANN_GPU_MODEL_EXCLUDE: "t4"}))
    three = s.create_pod(pod("c", [(300, 0)], annotations={podspec.ANN_GPU_MODEL: "A100"}))
    any_model = s.create_pod(pod("d", [(30, 4)]))
    ext = await start_extender()
    names = ["a100", "t4", "mixed"]

    passed, failed, never = verdict(await ext.filter(args(want_a100, names)))
    assert passed == ["a100"]
    assert "no card matches gpu-model a100,h100" in never["t4"] and "Tesla T4" in never["t4"]
    assert "mixed" in failed  # its A100 cards are taken: not now, not never
    assert "the best cards" in failed["mixed"] or "held whole by whole-card pods" in failed["mixed"]

    passed, failed, never = verdict(await ext.filter(args(no_t4, names)))
    assert passed == ["a100"] and "t4" in never and "mixed" in failed

    passed, failed, never = verdict(await ext.filter(args(three, names)))
    assert passed == ["a100"]
    assert "2 of its 4 cards accepted" in never["mixed"]

    passed, _, _ = verdict(await ext.filter(args(any_model, names)))
    assert passed == names  # on mixed, the T4 cards are free


async def test_unhealthy_cards_are_not_used(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("sick0", inventory(2), unhealthy=[0]))
    s.create_node(node("allsick", inventory(2), unhealthy=[0, 1]))
    s.create_node(node("busy", inventory(2), unhealthy=[0]))
    s.create_pod(holding("runs-on-sick", "busy", [(50, 8, [0])]))  # still counted on its sick card
    s.create_pod(holding("other", "busy", [(60, 8, [1])]))
    whole = s.create_pod(pod("whole", [(100, 0)]))
    pair = s.create_pod(pod("pair", [(200, 0)]))
    share = s.create_pod(pod("share", [(50, 8)]))
    ext = await start_extender()
    names = ["sick0", "allsick", "busy"]

    passed, failed, never = verdict(await ext.filter(args(whole, names)))
    assert passed == ["sick0"]
    assert "2 unhealthy cards" in never["allsick"]
    assert "busy" in failed  # its healthy card is in use: that can change

    passed, _, never = verdict(await ext.filter(args(pair, names)))
    assert passed == [] and set(never) == set(names)

    passed, failed, _ = verdict(await ext.filter(args(share, names)))
    assert passed == ["sick0"]
    assert "the best cards have 40 free cores" in failed["busy"]


async def test_all_gpu_containers_must_fit_at_once(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("one", inventory(1)))
    s.create_node(node("two", inventory(2)))
    s.create_node(node("two-busy", inventory(2)))
    s.create_pod(holding("h", "two-busy", [(50, 8, [0])]))
    twin = s.create_pod(pod("twin", [(60, 8), (0, 0), (60, 8)], names=["a", "sidecar", "b"]))
    mixed = s.create_pod(pod("mixed", [(100, 0), (30, 8)]))
    ext = await start_extender()
    names = ["one", "two", "two-busy"]

    passed, failed, never = verdict(await ext.filter(args(twin, names)))
    assert passed == ["two"]
    assert "container b:" in never["one"] and "even with no other pods" in never["one"]
    assert failed["two-busy"].startswith("container b: needs 60 cores")

    passed, failed, never = verdict(await ext.filter(args(mixed, names)))
    assert passed == ["two", "two-busy"]
    assert "one" in never


async def test_non_gpu_pods_pass_every_node_untouched(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("gpu", inventory(1)))
    api.store.create_node(node("plain", None))
    plain = api.store.create_pod(pod("web", [(0, 0)]))
    ext = await start_extender()

    doc = await ext.filter(args(plain, ["gpu", "plain", "not-yet-seen"]))

    assert doc["NodeNames"] == ["gpu", "plain", "not-yet-seen"]
    assert doc["FailedNodes"] == {} and doc["FailedAndUnresolvableNodes"] == {}


async def test_nodes_without_a_usable_inventory_can_never_fit(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("plain", None))
    api.store.create_node(node("broken", None, annotation='{"version": 1, "inventory": '))
    api.store.create_node(node("ok", inventory(1)))
    p = api.store.create_pod(pod("p", [(100, 0)]))
    ext = await start_extender()

    passed, failed, never = verdict(await ext.filter(args(p, ["plain", "broken", "ok", "ghost"])))

    assert passed == ["ok"]
    assert podspec.ANN_NODE_INVENTORY in never["plain"] and "agent" in never["plain"]
    assert "unusable" in never["broken"]
    assert "not known" in failed["ghost"]  # the watch may simply not have seen it yet


async def test_requests_no_node_can_satisfy(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(2)))
    odd = api.store.create_pod(pod("odd", [(150, 0)]))
    huge = api.store.create_pod(pod("huge", [(50, 1000)]))
    memory_only = api.store.create_pod(pod("mem", [(0, 8)]))
    ext = await start_extender()

    for p, words in ((odd, "multiple of 100"), (huge, "largest card has 40960 MiB"),
                     (memory_only, "without tencent.com/vcuda-core")):
        passed, failed, never = verdict(await ext.filter(args(p, ["n"])))
        assert passed == [] and failed == {}
        assert words in never["n"]


async def test_nodes_mode_answers_with_the_node_objects(api: KubeApiServer, start_extender: Any) -> None:
    big, small = node("big", inventory(2)), node("small", inventory(1))
    api.store.create_node(big)
    api.store.create_node(small)
    p = api.store.create_pod(pod("p", [(200, 0)]))
    ext = await start_extender()

    doc = await ext.filter(args_nodes(p, [big, small]))

    assert doc["NodeNames"] is None
    assert doc["Nodes"]["items"] == [big]
    assert "asks 2 whole cards, but the node has 1" in doc["FailedAndUnresolvableNodes"]["small"]


async def test_a_pod_scheduled_again_does_not_compete_with_its_own_old_choice(api: KubeApiServer,
                                                                          start_extender: Any) -> None:
    # A bind that failed after writing the annotations leaves them on the pending pod; its next attempt must
    # not count them against itself (gpu-admission refused such pods), while other pods must.
    api.store.create_node(node("solo", inventory(1)))
    stale = holding("retry", "solo", [(100, 0, [0])], phase="Pending", bound=False)
    retry = api.store.create_pod(stale)
    other = api.store.create_pod(pod("other", [(100, 0)]))
    ext = await start_extender()

    assert verdict(await ext.filter(args(retry, ["solo"])))[0] == ["solo"]
    assert "solo" in verdict(await ext.filter(args(other, ["solo"])))[1]


async def test_filter_and_prioritize_make_no_api_request(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(2)))
    p = api.store.create_pod(pod("p", [(50, 8)]))
    ext = await start_extender()
    api.store.reset_request_counts()

    for _ in range(3):
        await ext.filter(args(p, ["n"]))
        await ext.prioritize(args(p, ["n"]))

    counts = api.store.request_counts()
    assert {verb: n for verb, n in counts.items() if verb != "watch"} == {}, counts
