"""Bind over HTTP against the API test server: the annotations written, the Binding, failures, concurrency."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from typing import Any

from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, holding, inventory, node, pod

MEM = 40960


def annotations(api: KubeApiServer, name: str) -> dict[str, str]:
    p = api.store.get_pod("default", name)
    assert p is not None
    return dict(p["metadata"].get("annotations") or {})


def bound_to(api: KubeApiServer, name: str) -> str | None:
    p = api.store.get_pod("default", name)
    assert p is not None
    return (p.get("spec") or {}).get("nodeName")


async def test_bind_records_the_cards_by_minor_and_binds(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(3, minors=[3, 7, 9])))
    api.store.create_pod(holding("h", "n", [(50, 8, [3])]))
    p = api.store.create_pod(pod("p", [(0, 0), (60, 16), (100, 0)], names=["log", "train", "eval"]))
    ext = await start_extender()
    before = time.time_ns()

    assert await ext.bind(p, "n") == ""

    ann = annotations(api, "p")
    # 60 cores do not fit next to the 50 on nvidia3, and the whole card must be another free one
    assert {ann[f"{podspec.ANN_PREDICATE_IDX}1"], ann[f"{podspec.ANN_PREDICATE_IDX}2"]} == {"7", "9"}
    assert f"{podspec.ANN_PREDICATE_IDX}0" not in ann  # the sidecar asks for no GPU
    assert ann[podspec.ANN_PREDICATE_NODE] == "n"
    assert ann[podspec.ANN_ASSIGNED] == "false"
    assert before <= int(ann[podspec.ANN_PREDICATE_TIME]) <= time.time_ns()
    assert bound_to(api, "p") == "n"


async def test_whole_card_and_share_never_land_on_one_card(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(2)))
    p = api.store.create_pod(pod("p", [(100, 0), (30, 8)]))
    ext = await start_extender()

    assert await ext.bind(p, "n") == ""

    ann = annotations(api, "p")
    assert {ann[f"{podspec.ANN_PREDICATE_IDX}0"], ann[f"{podspec.ANN_PREDICATE_IDX}1"]} == {"0", "1"}


async def test_a_bound_card_is_taken_for_the_next_pod(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("solo", inventory(1)))
    first = api.store.create_pod(pod("first", [(100, 0)]))
    second = api.store.create_pod(pod("second", [(10, 1)]))
    ext = await start_extender()

    assert await ext.bind(first, "solo") == ""
    doc = await ext.filter(args(second, ["solo"]))  # no waiting for the watch: the bind's assumption counts

    assert doc["NodeNames"] == []
    error = await ext.bind(second, "solo")
    assert "the healthy card is held whole by whole-card pods" in error
    assert bound_to(api, "second") is None and podspec.ANN_PREDICATE_NODE not in annotations(api, "second")


async def test_refused_binds_change_nothing(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(1)))
    api.store.create_node(node("plain", None))
    p = api.store.create_pod(pod("p", [(200, 0)]))
    q = api.store.create_pod(pod("q", [(100, 0)]))
    ext = await start_extender()

    assert "asks 2 whole cards" in await ext.bind(p, "n")
    status, doc = await ext.post("bind", {"PodName": "q", "PodNamespace": "default", "PodUID": q["metadata"]["uid"],
                                          "Node": "plain"})
    assert status == 422 and "no gpumgr.io/gpu-inventory annotation" in doc["Error"]
    wrong_uid = dict(q, metadata=dict(q["metadata"], uid="00000000-0000-0000-0000-000000000000"))
    assert "UID" in await ext.bind(wrong_uid, "n")
    status, doc = await ext.post("bind", {"PodName": "ghost", "PodNamespace": "default", "PodUID": "", "Node": "n"})
    assert status == 200 and "404" in doc["Error"]

    for name in ("p", "q"):
        assert bound_to(api, name) is None
        assert not any(k.startswith("tencent.com/") for k in annotations(api, name))
    assert await ext.bind(q, "n") == ""  # nothing was left assumed on n


async def test_a_failed_binding_takes_back_annotations_and_cards(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("solo", inventory(1)))
    doomed = api.store.create_pod(pod("doomed", [(100, 0)]))
    api.store.merge_patch_pod("default", "doomed", {"metadata": {"deletionTimestamp": "2030-01-01T00:00:00Z"}})
    nxt = api.store.create_pod(pod("next", [(100, 0)]))
    ext = await start_extender()

    error = await ext.bind(doomed, "solo")

    assert "cannot create the Binding" in error and "being deleted" in error
    assert not any(k.startswith("tencent.com/") for k in annotations(api, "doomed"))
    assert await ext.bind(nxt, "solo") == ""


async def test_bind_retries_when_the_pod_changes_meanwhile(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(1)))
    p = api.store.create_pod(pod("p", [(30, 8)]))
    ext = await start_extender()
    stop = threading.Event()

    def churn() -> None:  # another controller keeps updating the pod: the extender's copy goes stale
        for i in range(40):
            if stop.is_set():
                return
            api.store.merge_patch_pod("default", "p", {"metadata": {"labels": {f"churn-{i}": "x"}}})
            time.sleep(0.002)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        await asyncio.sleep(0.01)
        error = await ext.bind(p, "n")
    finally:
        stop.set()
        worker.join(timeout=5)

    assert error == ""
    current = api.store.get_pod("default", "p")
    assert current is not None
    assert current["spec"]["nodeName"] == "n"
    assert current["metadata"]["annotations"][f"{podspec.ANN_PREDICATE_IDX}0"] == "0"
    assert "churn-0" in current["metadata"]["labels"]  # a merge patch: nobody's change was overwritten


async def test_fifty_concurrent_binds_never_double_book_a_card(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("big", inventory(8, memory_mib=MEM)))
    rng = random.Random(11)
    pods = []
    for i in range(50):
        if rng.random() < 0.2:
            ask = [(100 * rng.choice([1, 1, 2]), 0)]
        else:
            ask = [(rng.choice([10, 20, 30, 40, 60]), rng.choice([4, 16, 40, 64]))]
        pods.append(api.store.create_pod(pod(f"p{i:02d}", ask)))
    ext = await start_extender()

    errors = await asyncio.gather(*(ext.bind(p, "big") for p in pods))

    cores: dict[int, int] = defaultdict(int)
    mem: dict[int, int] = defaultdict(int)
    whole: dict[int, int] = defaultdict(int)
    holders: dict[int, int] = defaultdict(int)
    bound = 0
    for p, error in zip(pods, errors, strict=True):
        name = p["metadata"]["name"]
        ann = annotations(api, name)
        if error:
            assert bound_to(api, name) is None and podspec.ANN_PREDICATE_NODE not in ann, name
            continue
        bound += 1
        assert bound_to(api, name) == "big"
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        c, units = int(limits[podspec.RESOURCE_CORE]), int(limits.get(podspec.RESOURCE_MEMORY, "0"))
        cards = [int(x) for x in ann[f"{podspec.ANN_PREDICATE_IDX}0"].split(",")]
        for card in cards:
            holders[card] += 1
            if c >= 100:
                whole[card] += 1
            else:
                cores[card] += c
                mem[card] += units * 256
    assert 8 <= bound < 50  # some fit, and the node was asked for more than it has
    for card in range(8):
        assert cores[card] <= 100 and mem[card] <= MEM, card
        assert whole[card] == 0 or holders[card] == 1, f"card {card} held whole and shared"


async def test_non_gpu_pod_is_refused_without_annotations(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", None))
    p = api.store.create_pod(pod("web", [(0, 0)]))
    ext = await start_extender()

    meta = p["metadata"]
    status, doc = await ext.post("bind", {"PodName": "web", "PodNamespace": "default", "PodUID": meta["uid"],
                                          "Node": "n"})
    assert status == 403 and "asks for no" in doc["Error"]
    assert bound_to(api, "web") is None
    assert not any(k.startswith("tencent.com/") for k in annotations(api, "web"))
