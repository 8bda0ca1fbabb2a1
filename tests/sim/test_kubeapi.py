"""The Kubernetes API test server, driven by the real `kubernetes` client (and raw HTTP where the client
cannot send what a test needs)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from gpumgr.sim.kubeapi import KubeApiServer, KubeStore, ThreadedKubeApiServer

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
NS = "default"


# ---- fixtures and helpers ---------------------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[ThreadedKubeApiServer]:
    server = ThreadedKubeApiServer()
    server.start()
    yield server
    server.stop()


def core_api(server: ThreadedKubeApiServer, tmp_path: Path) -> client.CoreV1Api:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    api_client.configuration.connection_pool_maxsize = 64
    api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = 64
    return client.CoreV1Api(api_client)


@pytest.fixture
def v1(api: ThreadedKubeApiServer, tmp_path: Path) -> client.CoreV1Api:
    return core_api(api, tmp_path)


def pod(name: str, *, labels: dict[str, str] | None = None, namespace: str = NS,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "cuda:12"}]}}


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": {"capacity": {"tencent.com/vcuda-core": "200"}}}


def binding(pod_name: str, node_name: str, kind: str = "Node") -> client.V1Binding:
    return client.V1Binding(metadata=client.V1ObjectMeta(name=pod_name),
                            target=client.V1ObjectReference(kind=kind, name=node_name))


def raw(server: ThreadedKubeApiServer, method: str, path: str, body: bytes | None = None,
        content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type} if body is not None else {}
    request = urllib.request.Request(server.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def status_of(err: ApiException) -> dict[str, Any]:
    body = json.loads(err.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == err.status
    return body


def names(items: list[Any]) -> list[str]:
    return [item.metadata.name for item in items]


def collect(stream: Iterator[dict[str, Any]], w: watch.Watch, count: int) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of the first `count` events, then stop the watch."""
    seen: list[tuple[str, str, str]] = []
    for event in stream:
        obj = event["raw_object"]
        seen.append((event["type"], obj["metadata"].get("name", ""), obj["metadata"]["resourceVersion"]))
        if len(seen) == count:
            w.stop()
    return seen


# ---- discovery and configuration -------------------------------------------------------------------------


def test_kubeconfig_loads_with_load_kube_config_and_discovery_answers(api: ThreadedKubeApiServer,
                                                                      tmp_path: Path) -> None:
    path = api.write_kubeconfig(tmp_path / "sub" / "config")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=configuration)
    assert configuration.host == api.url
    with client.ApiClient(configuration) as api_client:
        assert client.VersionApi(api_client).get_code().major == "1"
        assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
        resources = {r.name for r in client.CoreV1Api(api_client).get_api_resources().resources}
    assert {"pods", "pods/status", "pods/binding", "nodes", "nodes/status", "events"} <= resources


def test_unknown_path_and_method_are_status_errors(api: ThreadedKubeApiServer) -> None:
    code, body = raw(api, "GET", "/api/v1/namespaces/default/secrets")
    assert (code, body["reason"], body["kind"]) == (404, "NotFound", "Status")
    code, body = raw(api, "POST", "/api/v1/pods", b"{}")
    assert (code, body["reason"]) == (405, "MethodNotAllowed")
    code, body = raw(api, "GET", "/api/v1/nodes/x/binding")
    assert code == 404


# ---- create, get, list, delete -----------------------------------------------------------------------------


def test_create_assigns_identity_and_pending_phase(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    body = pod("p1")
    body["status"] = {"phase": "Running"}  # a client cannot create a running pod
    created = v1.create_namespaced_pod(NS, body)
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    assert created.status.phase == "Pending"
    assert created.spec.scheduler_name == "default-scheduler"
    assert int(created.metadata.resource_version) == api.store.resource_version
    fetched = v1.read_namespaced_pod("p1", NS)
    assert fetched.metadata.uid == created.metadata.uid
    generated = v1.create_namespaced_pod(NS, {"metadata": {"generateName": "job-"},
                                              "spec": {"containers": [{"name": "c"}]}})
    assert generated.metadata.name.startswith("job-") and len(generated.metadata.name) == len("job-") + 5


def test_create_twice_is_already_exists(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, pod("p1"))
    body = status_of(err.value)
    assert (body["code"], body["reason"]) == (409, "AlreadyExists")
    assert body["details"] == {"name": "p1", "kind": "pods"}


@pytest.mark.parametrize(("change", "code"), [
    ({"metadata": {"name": "Bad_Name"}}, 422),
    ({"spec": {"containers": []}}, 422),
    ({"metadata": {"name": "p1", "resourceVersion": "5"}}, 400),
    ({"metadata": {"name": "p1", "namespace": "other"}}, 400),
    ({"kind": "Node"}, 400),
])
def test_invalid_create_is_rejected_and_changes_nothing(v1: client.CoreV1Api, api: ThreadedKubeApiServer,
                                                        change: dict[str, Any], code: int) -> None:
    body = pod("p1")
    body.update(change)
    before = api.store.resource_version
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, body)
    assert status_of(err.value)["code"] == code
    assert api.store.resource_version == before and api.store.list_pods() == []


def test_get_missing_is_not_found(v1: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod("ghost", NS)
    body = status_of(err.value)
    assert (body["reason"], body["message"]) == ("NotFound", 'pods "ghost" not found')
    with pytest.raises(ApiException) as err:
        v1.read_node("ghost")
    assert status_of(err.value)["reason"] == "NotFound"


def test_list_namespaced_and_all_namespaces(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    v1.create_namespaced_pod(NS, pod("a"))
    v1.create_namespaced_pod("team", pod("b", namespace="team"))
    v1.create_node(node("n1"))
    in_default = v1.list_namespaced_pod(NS)
    assert names(in_default.items) == ["a"]
    assert in_default.metadata.resource_version == str(api.store.resource_version)
    assert names(v1.list_pod_for_all_namespaces().items) == ["a", "b"]
    assert names(v1.list_node().items) == ["n1"]


def test_list_pages_with_limit_and_continue(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    for i in range(5):
        v1.create_namespaced_pod(NS, pod(f"p{i}"))
    seen: list[str] = []
    token = None
    for _ in range(10):
        page = v1.list_namespaced_pod(NS, limit=2, _continue=token)
        seen += names(page.items)
        token = page.metadata._continue
        if not token:
            break
    assert seen == [f"p{i}" for i in range(5)]
    code, body = raw(api, "GET", "/api/v1/namespaces/default/pods?limit=2&continue=garbage!")
    assert (code, body["reason"]) == (400, "BadRequest")


def test_delete_returns_the_pod_and_honours_preconditions(v1: client.CoreV1Api) -> None:
    created = v1.create_namespaced_pod(NS, pod("p1"))
    with pytest.raises(ApiException) as err:
        v1.delete_namespaced_pod("p1", NS, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="not-the-uid")))
    assert status_of(err.value)["reason"] == "Conflict"
    deleted = v1.delete_namespaced_pod("p1", NS, grace_period_seconds=30)
    assert deleted.metadata.uid == created.metadata.uid
    assert v1.list_namespaced_pod(NS).items == []
    with pytest.raises(ApiException) as err:
        v1.delete_namespaced_pod("p1", NS)
    assert err.value.status == 404
    v1.create_node(node("n1"))
    assert v1.delete_node("n1")["status"] == "Success"


def test_delete_collection_removes_matching_objects(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    v1.create_namespaced_pod(NS, pod("a", labels={"batch": "1"}))
    v1.create_namespaced_pod(NS, pod("b", labels={"batch": "1"}))
    v1.create_namespaced_pod(NS, pod("c"))
    v1.create_namespaced_pod("team", pod("d", namespace="team", labels={"batch": "1"}))
    start = v1.list_pod_for_all_namespaces().metadata.resource_version
    assert v1.delete_collection_namespaced_pod(NS, label_selector="batch=1").status == "Success"
    assert names(v1.list_pod_for_all_namespaces().items) == ["c", "d"]
    w = watch.Watch()
    seen = collect(w.stream(v1.list_namespaced_pod, NS, resource_version=start, timeout_seconds=20), w, 2)
    assert [(t, n) for t, n, _ in seen] == [("DELETED", "a"), ("DELETED", "b")]


# ---- selectors ---------------------------------------------------------------------------------------------


@pytest.fixture
def labelled(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> client.CoreV1Api:
    v1.create_namespaced_pod(NS, pod("web", labels={"app": "web", "tier": "front"}))
    v1.create_namespaced_pod(NS, pod("db", labels={"app": "db", "tier": "back"}))
    v1.create_namespaced_pod(NS, pod("plain"))
    v1.create_namespaced_pod("team", pod("other", namespace="team", labels={"app": "web"}))
    api.store.bind_pod(NS, "web", "n1")
    api.store.bind_pod(NS, "db", "n2")
    api.store.set_pod_phase(NS, "db", "Running")
    return v1


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=web", ["web"]),
    ("app==web", ["web"]),
    ("app!=web", ["db", "plain"]),
    ("app in (web, db)", ["db", "web"]),
    ("app notin (web)", ["db", "plain"]),
    ("tier", ["db", "web"]),
    ("!tier", ["plain"]),
    ("app=web,tier=front", ["web"]),
    ("app in (web),tier notin (front)", []),
    ("", ["db", "plain", "web"]),
])
def test_label_selectors(labelled: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert names(labelled.list_namespaced_pod(NS, label_selector=selector).items) == expected


@pytest.mark.parametrize(("selector", "expected"), [
    ("spec.nodeName=n1", ["web"]),
    ("spec.nodeName==n2", ["db"]),
    ("spec.nodeName=", ["plain", "other"]),
    ("status.phase!=Running", ["plain", "web", "other"]),
    ("status.phase=Pending,spec.nodeName!=", ["web"]),
    ("metadata.name=other", ["other"]),
    ("metadata.namespace=team", ["other"]),
])
def test_field_selectors(labelled: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert names(labelled.list_pod_for_all_namespaces(field_selector=selector).items) == expected


@pytest.mark.parametrize("query", [
    "labelSelector=app%20in%20(web", "labelSelector=app%3D%3D%3Dx", "labelSelector=Bad%20Key%3Dx",
    "fieldSelector=spec.hostname%3Dx", "fieldSelector=status.phase", "watch=maybe", "limit=-1",
])
def test_bad_query_is_bad_request(api: ThreadedKubeApiServer, query: str) -> None:
    code, body = raw(api, "GET", f"/api/v1/pods?{query}")
    assert (code, body["reason"], body["kind"]) == (400, "BadRequest", "Status")


def test_node_field_and_label_selectors(v1: client.CoreV1Api) -> None:
    v1.create_node(node("n1", {"gpu": "a100"}))
    v1.create_node(node("n2", {"gpu": "t4"}))
    v1.patch_node("n2", {"spec": {"unschedulable": True}})
    assert names(v1.list_node(label_selector="gpu in (t4)").items) == ["n2"]
    assert names(v1.list_node(field_selector="spec.unschedulable!=true").items) == ["n1"]
    assert names(v1.list_node(field_selector="metadata.name=n1").items) == ["n1"]


# ---- watch -------------------------------------------------------------------------------------------------


def test_watch_delivers_live_events_in_order(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    w = watch.Watch()
    seen: list[tuple[str, str, str]] = []
    for event in w.stream(v1.list_namespaced_pod, NS, timeout_seconds=20):
        seen.append((event["type"], event["object"].metadata.name, event["object"].metadata.resource_version))
        if len(seen) == 1:  # the watch is open: now change the cluster
            api.store.create_pod(pod("p2"))
            api.store.set_pod_phase(NS, "p1", "Running")
            api.store.delete_pod(NS, "p2")
        if len(seen) == 4:
            w.stop()
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "p1"), ("ADDED", "p2"), ("MODIFIED", "p1"),
                                           ("DELETED", "p2")]
    versions = [int(rv) for _, _, rv in seen[1:]]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_watch_resumes_from_resource_version(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    v1.create_namespaced_pod(NS, pod("old"))
    start = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("p1"))
    v1.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"x": "1"}}})
    v1.delete_namespaced_pod("old", NS)
    w = watch.Watch()
    seen = collect(w.stream(v1.list_namespaced_pod, NS, resource_version=start, timeout_seconds=20), w, 3)
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "p1"), ("MODIFIED", "p1"), ("DELETED", "old")]
    assert [int(rv) for _, _, rv in seen] == [int(start) + 1, int(start) + 2, int(start) + 3]


def test_watch_from_compacted_version_is_gone(tmp_path: Path) -> None:
    with ThreadedKubeApiServer(KubeStore(history_size=3)) as server:
        v1 = core_api(server, tmp_path)
        for i in range(6):
            v1.create_namespaced_pod(NS, pod(f"p{i}"))
        with pytest.raises(ApiException) as err:
            for _ in watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version="1",
                                          timeout_seconds=5):
                pass
        assert err.value.status == 410
        url = server.url + "/api/v1/namespaces/default/pods?watch=1&resourceVersion=1"
        with urllib.request.urlopen(url, timeout=10) as response:
            event = json.loads(response.readline())
        assert event["type"] == "ERROR"
        assert event["object"]["kind"] == "Status" and event["object"]["code"] == 410
        assert event["object"]["reason"] == "Expired"
        # a recent enough version still resumes
        w = watch.Watch()
        seen = collect(w.stream(v1.list_namespaced_pod, NS, resource_version="4", timeout_seconds=5), w, 2)
        assert [n for _, n, _ in seen] == ["p4", "p5"]


def test_watch_with_selectors_sees_objects_enter_and_leave(v1: client.CoreV1Api,
                                                          api: ThreadedKubeApiServer) -> None:
    v1.create_namespaced_pod(NS, pod("p1", labels={"gpu": "yes"}))
    v1.create_namespaced_pod(NS, pod("p2"))
    start = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_binding(NS, binding("p2", "node-a"))
    v1.create_namespaced_binding(NS, binding("p1", "node-b"))
    v1.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"gpu": None}}})
    v1.patch_namespaced_pod("p2", NS, {"metadata": {"labels": {"gpu": "yes"}}})
    w = watch.Watch()
    on_node = collect(w.stream(v1.list_pod_for_all_namespaces, field_selector="spec.nodeName=node-a",
                               resource_version=start, timeout_seconds=20), w, 2)
    assert [(t, n) for t, n, _ in on_node] == [("ADDED", "p2"), ("MODIFIED", "p2")]
    w = watch.Watch()
    gpu = collect(w.stream(v1.list_namespaced_pod, NS, label_selector="gpu=yes", resource_version=start,
                           timeout_seconds=20), w, 3)
    assert [(t, n) for t, n, _ in gpu] == [("MODIFIED", "p1"), ("DELETED", "p1"), ("ADDED", "p2")]


def test_watch_ends_at_timeout_and_sends_bookmarks(tmp_path: Path) -> None:
    with ThreadedKubeApiServer(bookmark_interval=0.2) as server:
        v1 = core_api(server, tmp_path)
        v1.create_node(node("n1"))
        events = list(watch.Watch().stream(v1.list_node, timeout_seconds=1, allow_watch_bookmarks=True))
        assert events[0]["type"] == "ADDED"
        bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
        assert bookmarks, "an idle watch that allows bookmarks gets them"
        assert all(b["raw_object"]["metadata"]["resourceVersion"] == "1" for b in bookmarks)


# ---- update, patch, conflicts ------------------------------------------------------------------------------


def test_merge_and_strategic_patch_of_annotations(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1", annotations={"keep": "1", "drop": "2"}))
    merged = v1.patch_namespaced_pod("p1", NS, {"metadata": {"annotations": {"drop": None, "new": "3"}}},
                                     _content_type=MERGE)
    assert merged.metadata.annotations == {"keep": "1", "new": "3"}
    strategic = v1.patch_namespaced_pod("p1", NS, {"metadata": {"annotations": {"keep": "9"},
                                                                "labels": {"a": "b"}}})
    assert strategic.metadata.annotations == {"keep": "9", "new": "3"}
    assert strategic.metadata.labels == {"a": "b"}
    assert int(strategic.metadata.resource_version) > int(merged.metadata.resource_version)


def test_strategic_patch_merges_lists_by_key(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    v1.patch_namespaced_pod_status("p1", NS, {"status": {"conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}})
    patched = v1.patch_namespaced_pod_status("p1", NS, {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert {(c.type, c.status) for c in patched.status.conditions} == {("PodScheduled", "True"),
                                                                      ("Ready", "True")}
    replaced = v1.patch_namespaced_pod_status("p1", NS, {"status": {"conditions": [
        {"type": "Ready", "status": "False"}]}}, _content_type=MERGE)
    assert [(c.type, c.status) for c in replaced.status.conditions] == [("Ready", "False")]


def test_json_patch_add_replace_remove_and_failed_test(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1", annotations={"a": "1"}))
    patched = v1.patch_namespaced_pod("p1", NS, [
        {"op": "test", "path": "/metadata/annotations/a", "value": "1"},
        {"op": "add", "path": "/metadata/annotations/tencent.com~1gpu-assigned", "value": "true"},
        {"op": "replace", "path": "/metadata/annotations/a", "value": "2"},
        {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
        {"op": "remove", "path": "/metadata/labels/x"},
    ])
    assert patched.metadata.annotations == {"a": "2", "tencent.com/gpu-assigned": "true"}
    assert patched.metadata.labels == {}
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod("p1", NS, [
            {"op": "test", "path": "/metadata/annotations/a", "value": "1"},
            {"op": "replace", "path": "/metadata/annotations/a", "value": "3"}])
    assert status_of(err.value)["code"] == 422
    assert v1.read_namespaced_pod("p1", NS).metadata.annotations["a"] == "2"


def test_replace_with_stale_resource_version_conflicts(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    stale = v1.read_namespaced_pod("p1", NS)
    v1.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"v": "2"}}})
    stale.metadata.labels = {"v": "stale"}
    with pytest.raises(ApiException) as err:
        v1.replace_namespaced_pod("p1", NS, stale)
    body = status_of(err.value)
    assert body["reason"] == "Conflict" and "the object has been modified" in body["message"]
    fresh = v1.read_namespaced_pod("p1", NS)
    fresh.metadata.labels = {"v": "3"}
    replaced = v1.replace_namespaced_pod("p1", NS, fresh)
    assert replaced.metadata.labels == {"v": "3"}
    assert int(replaced.metadata.resource_version) > int(fresh.metadata.resource_version)


def test_patch_with_stale_resource_version_conflicts(v1: client.CoreV1Api) -> None:
    created = v1.create_namespaced_pod(NS, pod("p1"))
    rv = created.metadata.resource_version
    v1.patch_namespaced_pod("p1", NS, {"metadata": {"resourceVersion": rv, "annotations": {"n": "1"}}},
                            _content_type=MERGE)
    for content_type in (MERGE, STRATEGIC):
        with pytest.raises(ApiException) as err:
            v1.patch_namespaced_pod("p1", NS, {"metadata": {"resourceVersion": rv,
                                                            "annotations": {"n": "2"}}},
                                    _content_type=content_type)
        assert status_of(err.value)["reason"] == "Conflict"
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod("p1", NS, [{"op": "replace", "path": "/metadata/resourceVersion",
                                            "value": rv}])
    assert err.value.status == 409
    assert v1.read_namespaced_pod("p1", NS).metadata.annotations == {"n": "1"}


def test_main_resource_keeps_status_and_pod_spec_is_immutable(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    patched = v1.patch_namespaced_pod("p1", NS, {"status": {"phase": "Running"},
                                                 "metadata": {"labels": {"a": "b"}}})
    assert patched.status.phase == "Pending" and patched.metadata.labels == {"a": "b"}
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod("p1", NS, {"spec": {"nodeName": "n1"}})
    assert status_of(err.value)["reason"] == "Invalid"
    image = v1.patch_namespaced_pod("p1", NS, {"spec": {"containers": [{"name": "main",
                                                                         "image": "cuda:13"}]}})
    assert image.spec.containers[0].image == "cuda:13"


def test_status_subresource(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1", labels={"a": "1"}))
    current = v1.read_namespaced_pod_status("p1", NS)
    current.status.phase = "Running"
    current.metadata.labels = {"a": "changed-through-status"}
    updated = v1.replace_namespaced_pod_status("p1", NS, current)
    assert updated.status.phase == "Running" and updated.metadata.labels == {"a": "1"}
    with pytest.raises(ApiException) as err:
        v1.replace_namespaced_pod_status("p1", NS, current)  # current's resourceVersion is now stale
    assert err.value.status == 409
    v1.create_node(node("n1"))
    patched = v1.patch_node_status("n1", {"status": {"allocatable": {"tencent.com/vcuda-core": "100"}}})
    assert patched.status.allocatable == {"tencent.com/vcuda-core": "100"}
    assert patched.status.capacity == {"tencent.com/vcuda-core": "200"}
    assert v1.read_node_status("n1").status.allocatable == {"tencent.com/vcuda-core": "100"}


# ---- bindings and events -----------------------------------------------------------------------------------


def test_binding_sets_node_name_once(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    b = binding("p1", "node-a")
    b.metadata.annotations = {"tencent.com/predicate-node": "node-a"}
    answer = v1.create_namespaced_binding(NS, b)
    assert answer.target.name == "node-a"
    bound = v1.read_namespaced_pod("p1", NS)
    assert bound.spec.node_name == "node-a"
    assert bound.metadata.annotations == {"tencent.com/predicate-node": "node-a"}
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_binding(NS, binding("p1", "node-b"))
    assert status_of(err.value)["reason"] == "Conflict"
    assert v1.read_namespaced_pod("p1", NS).spec.node_name == "node-a"


def test_binding_resource_version_is_a_precondition(v1: client.CoreV1Api) -> None:
    """As BindingREST.setPodHostAndAnnotations: a Binding naming another version of the pod is a 409 Conflict."""
    created = v1.create_namespaced_pod(NS, pod("p1"))
    v1.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"changed": "yes"}}})
    stale = binding("p1", "node-a")
    stale.metadata.resource_version = created.metadata.resource_version
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_binding(NS, stale)
    assert status_of(err.value)["reason"] == "Conflict" and "ResourceVersion" in status_of(err.value)["message"]
    assert v1.read_namespaced_pod("p1", NS).spec.node_name is None
    current = binding("p1", "node-a")
    current.metadata.resource_version = v1.read_namespaced_pod("p1", NS).metadata.resource_version
    assert v1.create_namespaced_pod_binding("p1", NS, current).target.name == "node-a"
    assert v1.read_namespaced_pod("p1", NS).spec.node_name == "node-a"


def test_pod_binding_subresource_and_errors(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1"))
    assert v1.create_namespaced_pod_binding("p1", NS, binding("p1", "node-a")).target.name == "node-a"
    assert v1.read_namespaced_pod("p1", NS).spec.node_name == "node-a"
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod_binding("ghost", NS, binding("ghost", "node-a"))
    assert status_of(err.value)["reason"] == "NotFound"
    v1.create_namespaced_pod(NS, pod("p2"))
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod_binding("p2", NS, binding("p1", "node-a"))
    assert err.value.status == 400
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_binding(NS, binding("p2", "node-a", kind="Pod"))
    assert err.value.status == 422
    assert v1.read_namespaced_pod("p2", NS).spec.node_name is None


def test_events_are_accepted_and_listed(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="p1.gpumgr1", namespace=NS),
        involved_object=client.V1ObjectReference(kind="Pod", name="p1", namespace=NS),
        reason="GPUAllocated", message="card 0", type="Normal",
        source=client.V1EventSource(component="gpumgr"))
    created = v1.create_namespaced_event(NS, event)
    assert created.reason == "GPUAllocated" and created.count == 1
    listed = v1.list_namespaced_event(NS, field_selector="involvedObject.name=p1,reason=GPUAllocated")
    assert names(listed.items) == ["p1.gpumgr1"]
    assert [e["message"] for e in api.store.list_events(NS)] == ["card 0"]


# ---- malformed input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body", "content_type", "code"), [
    ("POST", "/api/v1/namespaces/default/pods", b"{not json", "application/json", 400),
    ("POST", "/api/v1/namespaces/default/pods", b"[1, 2]", "application/json", 400),
    ("POST", "/api/v1/namespaces/default/pods", b"", "application/json", 400),
    ("POST", "/api/v1/namespaces/default/pods",
     b'{"metadata": {"name": "p2", "annotations": {"n": 3}}, "spec": {"containers": [{"name": "c"}]}}',
     "application/json", 400),
    ("POST", "/api/v1/namespaces/default/pods", b"kind: Pod", "application/yaml", 415),
    ("PUT", "/api/v1/namespaces/default/pods/p1", b"\xff\xfe", "application/json", 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b"{\"metadata\": ", MERGE, 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b"[]", MERGE, 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b"{\"op\": \"add\"}", JSON_PATCH, 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b'[{"op": "move", "path": "/a"}]', JSON_PATCH, 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b"{}", "application/apply-patch+yaml", 415),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b"{\"metadata\": {\"labels\": {\"a\": 1}}}", MERGE, 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1", b"{\"metadata\": {\"name\": \"p2\"}}", MERGE, 400),
    ("PUT", "/api/v1/namespaces/default/pods/p1/status", b"{\"status\": ", "application/json", 400),
    ("POST", "/api/v1/namespaces/default/bindings", b"{\"target\": 5}", "application/json", 422),
    ("POST", "/api/v1/namespaces/default/bindings", b"oops", "application/json", 400),
    ("POST", "/api/v1/namespaces/default/events", b'{"metadata": {"name": "e"}}', "application/json", 422),
    ("POST", "/api/v1/namespaces/Bad_NS/pods", b"{}", "application/json", 400),
    ("PATCH", "/api/v1/namespaces/default/pods/p1?dryRun=All", b"{}", MERGE, 400),
])
def test_malformed_requests_are_rejected_and_change_nothing(api: ThreadedKubeApiServer, method: str,
                                                           path: str, body: bytes, content_type: str,
                                                           code: int) -> None:
    api.store.create_pod(pod("p1", annotations={"a": "1"}))
    before = api.store.get_pod(NS, "p1")
    rv = api.store.resource_version
    status, answer = raw(api, method, path, body, content_type)
    assert status == code
    assert answer["kind"] == "Status" and answer["status"] == "Failure" and answer["code"] == code
    assert answer["message"]
    assert api.store.resource_version == rv and api.store.get_pod(NS, "p1") == before


# ---- concurrency -------------------------------------------------------------------------------------------


def test_concurrent_conditional_patches_have_one_winner_per_version(v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("p1", annotations={"counter": "0"}))
    threads, wins_each = 8, 5
    barrier = threading.Barrier(threads, timeout=30)
    lock = threading.Lock()
    wins: list[tuple[str, int]] = []
    conflicts: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        won = 0
        for _ in range(500):
            if won == wins_each:
                return
            current = v1.read_namespaced_pod("p1", NS)
            rv, count = current.metadata.resource_version, int(current.metadata.annotations["counter"])
            try:
                v1.patch_namespaced_pod("p1", NS, {"metadata": {
                    "resourceVersion": rv, "annotations": {"counter": str(count + 1)}}}, _content_type=MERGE)
            except ApiException as err:
                with lock:
                    conflicts.append(err.status)
                continue
            except BaseException as err:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(err)
                return
            won += 1
            with lock:
                wins.append((rv, count + 1))

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(worker) for _ in range(threads)]
        for future in futures:
            future.result(timeout=120)
    assert errors == []
    assert set(conflicts) <= {409}
    total = threads * wins_each
    assert len(wins) == total
    assert len({rv for rv, _ in wins}) == total, "two patches won on the same resourceVersion"
    assert sorted(n for _, n in wins) == list(range(1, total + 1)), "an increment was lost"
    assert v1.read_namespaced_pod("p1", NS).metadata.annotations["counter"] == str(total)


def test_fifty_concurrent_binds_and_one_contested_pod(v1: client.CoreV1Api,
                                                      api: ThreadedKubeApiServer) -> None:
    count = 50
    for i in range(count):
        api.store.create_pod(pod(f"p{i}"))
    api.store.create_pod(pod("contested"))
    barrier = threading.Barrier(count, timeout=30)

    def bind(i: int) -> int:
        barrier.wait()
        target = "contested" if i % 5 == 0 else f"p{i}"
        try:
            v1.create_namespaced_binding(NS, binding(target, f"node-{i}"))
        except ApiException as err:
            return err.status
        return 201

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        results = list(pool.map(bind, range(count), timeout=120))
    contested = [results[i] for i in range(0, count, 5)]
    assert sorted(contested) == [201] + [409] * (len(contested) - 1)
    assert all(results[i] == 201 for i in range(count) if i % 5)
    winner = next(i for i in range(0, count, 5) if results[i] == 201)
    assert api.store.get_pod(NS, "contested")["spec"]["nodeName"] == f"node-{winner}"
    for i in range(count):
        if i % 5:
            assert api.store.get_pod(NS, f"p{i}")["spec"]["nodeName"] == f"node-{i}"
    assert api.store.request_counts("bindings") == {"create": count}


# ---- the in-process API and lifecycle ----------------------------------------------------------------------


def test_direct_api_seeds_state_without_requests(v1: client.CoreV1Api, api: ThreadedKubeApiServer) -> None:
    seeded = api.store.create_pod({**pod("p1"), "status": {"phase": "Running", "podIP": "10.0.0.1"}})
    seeded["metadata"]["labels"] = {"mutated": "copy"}
    assert api.store.get_pod(NS, "p1")["metadata"].get("labels") is None
    api.store.create_node(node("n1"))
    api.store.merge_patch_node("n1", {"metadata": {"labels": {"gpu": "a100"}}})
    current = api.store.get_pod(NS, "p1")
    assert current is not None
    current["spec"]["nodeName"] = "n1"
    api.store.update_pod(current)
    assert api.store.request_counts() == {}
    got = v1.read_namespaced_pod("p1", NS)
    assert (got.spec.node_name, got.status.phase) == ("n1", "Running")
    assert api.store.list_pods(node_name="n1")[0]["metadata"]["uid"] == seeded["metadata"]["uid"]
    assert v1.read_node("n1").metadata.labels == {"gpu": "a100"}
    assert api.store.request_counts() == {"get": 2}
    assert api.store.request_counts("pods") == {"get": 1}
    api.store.reset_request_counts()
    assert api.store.request_counts() == {}
    assert api.store.get_pod(NS, "ghost") is None


def test_restart_on_same_port_keeps_state(tmp_path: Path) -> None:
    store = KubeStore()
    with ThreadedKubeApiServer(store) as first:
        v1 = core_api(first, tmp_path)
        v1.create_namespaced_pod(NS, pod("p1"))
        port = first.port
    with ThreadedKubeApiServer(store, port=port) as second:
        assert second.port == port
        assert names(core_api(second, tmp_path).list_namespaced_pod(NS).items) == ["p1"]


async def test_async_server_serves_and_stop_ends_open_watches() -> None:
    async with KubeApiServer() as server:
        server.store.create_node(node("n1"))
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.url}/api/v1/nodes") as response:
                assert response.status == 200
                assert [n["metadata"]["name"] for n in (await response.json())["items"]] == ["n1"]
            watch_response = await session.get(f"{server.url}/api/v1/nodes?watch=true")
            first = json.loads(await asyncio.wait_for(watch_response.content.readline(), 10))
            assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "n1")
            await asyncio.wait_for(server.stop(), 10)
            rest = await asyncio.wait_for(watch_response.content.read(), 10)
            assert rest == b""
            watch_response.release()


# ---- resource.k8s.io/v1 (DRA) -------------------------------------------------------------------------------


def resource_api(server: ThreadedKubeApiServer, tmp_path: Path) -> client.ResourceV1Api:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig-resource")
    return client.ResourceV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def a_slice(name: str, node: str, driver: str = "vgpu.gpumgr.io") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}},
                                  "capacity": {"memory": {"value": "16Gi"}}, "allowMultipleAllocations": True}]}}


def test_resource_slices_through_the_real_client(api, tmp_path):
    rapi = resource_api(api, tmp_path)
    created = rapi.create_resource_slice(a_slice("n1-vgpu", "n1"))
    assert created.metadata.generation == 1
    assert created.spec.devices[0].allow_multiple_allocations is True
    rapi.create_resource_slice(a_slice("n2-vgpu", "n2"))
    rapi.create_resource_slice(a_slice("n1-other", "n1", driver="other.example.com"))
    mine = rapi.list_resource_slice(field_selector="spec.driver=vgpu.gpumgr.io,spec.nodeName=n1")
    assert [s.metadata.name for s in mine.items] == ["n1-vgpu"]
    assert mine.kind == "ResourceSliceList" and mine.api_version == "resource.k8s.io/v1"
    body = rapi.api_client.sanitize_for_serialization(created)
    body["spec"]["devices"][0]["capacity"]["memory"]["value"] = "8Gi"
    replaced = rapi.replace_resource_slice("n1-vgpu", body)
    assert replaced.metadata.generation == 2 and replaced.metadata.uid == created.metadata.uid
    rapi.delete_resource_slice("n1-vgpu")
    with pytest.raises(ApiException) as e:
        rapi.read_resource_slice("n1-vgpu")
    assert e.value.status == 404


def test_resource_slice_without_a_driver_is_invalid(api):
    body = a_slice("bad", "n1")
    del body["spec"]["driver"]  # the client refuses to send this: raw HTTP
    code, doc = raw(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", json.dumps(body).encode())
    assert code == 422 and "spec.driver" in doc["message"]
    assert api.store.list_resource("resourceslices") == []


def test_resource_claim_status_is_a_subresource_and_spec_is_immutable(api, tmp_path):
    rapi = resource_api(api, tmp_path)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c1"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.gpumgr.io"}}]}},
             "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}]}}
    created = rapi.create_namespaced_resource_claim(NS, claim)
    assert created.status is None  # status is not taken on create
    alloc = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "vgpu.gpumgr.io", "pool": "n1", "device": "gpu-0", "shareID": "a1b2",
         "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
    patched = rapi.patch_namespaced_resource_claim_status("c1", NS, alloc)
    res = patched.status.allocation.devices.results[0]
    assert (res.device, res.share_id, res.consumed_capacity) == ("gpu-0", "a1b2", {"memory": "4Gi", "cores": "30"})
    spec_change = {"spec": {"devices": {"requests": [{"name": "other", "exactly": {"deviceClassName": "x"}}]}}}
    with pytest.raises(ApiException) as e:
        rapi.patch_namespaced_resource_claim("c1", NS, spec_change)
    assert e.value.status == 422 and "immutable" in json.loads(e.value.body)["message"]
    # a main-resource update keeps the status
    labels = rapi.patch_namespaced_resource_claim("c1", NS, {"metadata": {"labels": {"a": "b"}}})
    assert labels.status.reserved_for[0].uid == "u1"


def test_device_classes_and_templates_and_discovery(api, tmp_path):
    rapi = resource_api(api, tmp_path)
    rapi.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                              "metadata": {"name": "vgpu.gpumgr.io"},
                              "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.gpumgr.io"'}}]}})
    assert rapi.read_device_class("vgpu.gpumgr.io").spec.selectors[0].cel.expression.startswith("device.driver")
    rapi.create_namespaced_resource_claim_template(NS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
        "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io"}}]}}}})
    assert [t.metadata.name for t in rapi.list_namespaced_resource_claim_template(NS).items] == ["t"]
    resources = {r.name for r in rapi.get_api_resources().resources}
    assert {"resourceslices", "resourceclaims", "resourceclaims/status", "resourceclaimtemplates",
            "deviceclasses"} <= resources
    groups = client.ApisApi(rapi.api_client).get_api_versions()
    assert "resource.k8s.io" in [g.name for g in groups.groups]
    # the core paths do not serve the group's resources
    assert raw(api, "GET", "/api/v1/resourceslices")[0] == 404
    assert raw(api, "GET", "/apis/resource.k8s.io/v1/pods")[0] == 404


def test_resource_claims_watch(api, tmp_path):
    rapi = resource_api(api, tmp_path)
    api.store.create_object("resourceclaims", {"metadata": {"name": "w1"}, "spec": {"devices": {}}})
    w = watch.Watch(return_type="ResourceV1ResourceClaim")  # the client cannot guess this model's name
    seen = []
    for ev in w.stream(rapi.list_namespaced_resource_claim, NS, timeout_seconds=2):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 1:
            api.store.merge_patch_object("resourceclaims", "w1", {"status": {"reservedFor": [
                {"resource": "pods", "name": "p", "uid": "u"}]}})
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1")]


def a_capacity_slice(value: str, policy: dict[str, Any]) -> dict[str, Any]:
    body = a_slice("cap", "n1")
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": value, "requestPolicy": policy}}
    return body


def mem_range(default: str, low: str, high: str, step: str) -> dict[str, Any]:
    return {"default": default, "validRange": {"min": low, "max": high, "step": step}}


@pytest.mark.parametrize("value, policy, field", [
    # an H100 reports 81559 MiB: not a multiple of a 256 MiB step
    ("81559Mi", mem_range("81559Mi", "256Mi", "81559Mi", "256Mi"), "validRange.max"),
    ("81559Mi", mem_range("81559Mi", "256Mi", "81408Mi", "256Mi"), "default"),
    # max above what is left (cores in `both` mode)
    ("40", {"default": "40", "validRange": {"min": "1", "max": "100", "step": "1"}}, "validRange.max"),
    # a card held whole: nothing left, min above value
    ("0", {"default": "0", "validRange": {"min": "1", "max": "0", "step": "1"}}, "validRange.min"),
    ("1", {"default": "1", "validRange": {"min": "1", "max": "1", "step": "1"}}, "validRange.step"),
    ("4Gi", {"validRange": {"min": "1Gi", "max": "4Gi", "step": "1Gi"}}, "default"),
    ("4Gi", {"default": "3Gi", "validValues": ["1Gi", "2Gi"]}, "default"),
    ("4Gi", {"default": "1Gi", "validValues": ["2Gi", "1Gi"]}, "validValues"),
    ("lots", None, "value"),
])
def test_resource_slice_capacity_policies_are_checked_as_the_api_server_does(api, value, policy, field):
    body = a_capacity_slice(value, policy)
    code, doc = raw(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", json.dumps(body).encode())
    assert code == 422, doc
    assert "spec.devices[0].capacity[memory]" in doc["message"] and field in doc["message"]
    assert api.store.list_resource("resourceslices") == []


def test_a_valid_capacity_policy_is_accepted_and_a_bad_replace_changes_nothing(api, tmp_path):
    rapi = resource_api(api, tmp_path)
    created = rapi.create_resource_slice(a_capacity_slice("81559Mi", mem_range("81408Mi", "256Mi", "81408Mi",
                                                                                "256Mi")))
    body = rapi.api_client.sanitize_for_serialization(created)
    body["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] = "81559Mi"
    with pytest.raises(ApiException) as e:
        rapi.replace_resource_slice("cap", body)
    assert e.value.status == 422 and "multiple of step" in e.value.body
    [kept] = api.store.list_resource("resourceslices")
    assert kept["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] == "81408Mi"


def test_a_request_policy_needs_a_device_that_allows_multiple_allocations(api):
    body = a_capacity_slice("4Gi", mem_range("4Gi", "1Gi", "4Gi", "1Gi"))
    body["spec"]["devices"][0]["allowMultipleAllocations"] = False
    code, doc = raw(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", json.dumps(body).encode())
    assert code == 422 and "allowMultipleAllocations" in doc["message"]
