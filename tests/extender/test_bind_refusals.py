"""Binds the extender must never make (issue 9, item 1): a 4xx with a JSON `Error`, and nothing changed —
no annotation, no Binding, nothing assumed."""

from __future__ import annotations

from typing import Any

from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import inventory, node, pod


def untouched(api: KubeApiServer, name: str, namespace: str = "default", node_name: str | None = None) -> bool:
    p = api.store.get_pod(namespace, name)
    assert p is not None
    ann = p["metadata"].get("annotations") or {}
    return p["spec"].get("nodeName") == node_name and not any(k.startswith("tencent.com/") for k in ann)


async def bind(ext: Any, p: dict[str, Any], node_name: str) -> tuple[int, Any]:
    meta = p["metadata"]
    return await ext.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                   "PodUID": meta["uid"], "Node": node_name})


async def test_a_pod_asking_for_no_vcuda_resource_is_refused(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("gpu", inventory(1)))
    web = api.store.create_pod(pod("coredns", [(0, 0)], namespace="kube-system"))
    ext = await start_extender()

    status, doc = await bind(ext, web, "gpu")

    assert status == 403 and "asks for no tencent.com/vcuda-core" in doc["Error"], doc
    assert untouched(api, "coredns", "kube-system")


async def test_a_pod_of_another_scheduler_is_refused(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("gpu", inventory(1)))
    p = pod("other", [(100, 0)])
    p["spec"]["schedulerName"] = "default-scheduler"
    other = api.store.create_pod(p)
    unset = pod("unset", [(100, 0)])
    del unset["spec"]["schedulerName"]
    unset = api.store.create_pod(unset)
    ext = await start_extender()

    for victim in (other, unset):
        status, doc = await bind(ext, victim, "gpu")
        assert status == 403 and "'default-scheduler'" in doc["Error"] and "--scheduler-name" in doc["Error"], doc
        assert untouched(api, victim["metadata"]["name"])
    custom = await start_extender(scheduler_name="default-scheduler")
    status, doc = await bind(custom, other, "gpu")
    assert status == 200 and doc["Error"] == "", doc


async def test_a_pod_already_bound_is_refused(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("gpu", inventory(2)))
    api.store.create_node(node("gpu2", inventory(2)))
    p = api.store.create_pod(pod("p", [(100, 0)], node="gpu2"))
    ext = await start_extender()

    status, doc = await bind(ext, p, "gpu")

    assert status == 409 and "already bound to node gpu2" in doc["Error"], doc
    assert untouched(api, "p", node_name="gpu2")


async def test_a_node_that_does_not_exist_or_has_no_gpus_is_refused(api: KubeApiServer,
                                                                   start_extender: Any) -> None:
    api.store.create_node(node("gpu", inventory(1)))
    api.store.create_node(node("cpu-only", None))
    api.store.create_node(node("broken", None, annotation="{not an inventory"))
    p = api.store.create_pod(pod("p", [(100, 0)]))
    ext = await start_extender()

    for target, words in (("nowhere", "node nowhere does not exist"), ("cpu-only", "not a GPU node"),
                          ("broken", "not a GPU node")):
        status, doc = await bind(ext, p, target)
        assert status == 422 and words in doc["Error"], (target, doc)
        assert untouched(api, "p")
    status, doc = await bind(ext, p, "gpu")  # nothing was assumed by the refusals
    assert status == 200 and doc["Error"] == ""
    bound = api.store.get_pod("default", "p")
    assert bound is not None and podspec.pod_annotations(bound)[podspec.ANN_PREDICATE_NODE] == "gpu"
