"""The pod cache's list + watch over the REST client against the API test server: events, resuming from the
last resourceVersion (events and bookmarks) without listing again, and listing again when it expired (410)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpumgr.kube import pod_cache
from gpumgr.kube.client import KubeClient
from gpumgr.kube.pod_cache import PodCache
from gpumgr.sim.kubeapi import KubeStore
from tests.helpers import until
from tests.kube.conftest import Cluster, ClusterFactory, Handler


def pod(name: str, node: str = "n") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}


def watches(c: Cluster) -> list[web.Request]:
    return [r for r in c.seen if r.query.get("watch") == "true"]


async def started(c: Cluster, tmp_path: Path) -> tuple[KubeClient, PodCache, list[int]]:
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    cache = PodCache(kube, "n")
    changes = [0]

    def changed() -> None:
        changes[0] += 1
    cache.start(on_change=changed)
    assert await cache.wait_synced(10)
    return kube, cache, changes


async def test_events_reach_the_cache_and_deletions_are_remembered(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = await cluster()
    first = c.store.create_pod(pod("first"))
    c.store.create_pod(pod("elsewhere", "other"))
    kube, cache, changes = await started(c, tmp_path)
    try:
        assert [p["metadata"]["name"] for p in cache.pods()] == ["first"]
        p = c.store.create_pod(pod("second"))
        await until(lambda: cache.get(p["metadata"]["uid"]) is not None)
        c.store.set_pod_phase("default", "second", "Running")
        await until(lambda: (cache.get(p["metadata"]["uid"]) or {}).get("status", {}).get("phase") == "Running")
        c.store.delete_pod("default", "first")
        await until(lambda: cache.known_finished(first["metadata"]["uid"]))
        assert cache.get(first["metadata"]["uid"]) is None and changes[0] >= 4
        assert cache.lists == 1
        assert c.seen[0].query.get("watch") is None and watches(c)[0].query["allowWatchBookmarks"] == "true"
    finally:
        await cache.aclose()
        await kube.aclose()


async def test_a_watch_the_server_ends_is_resumed_from_the_last_version_without_listing(
        cluster: ClusterFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cache, "WATCH_TIMEOUT_S", 1)
    c = await cluster()
    kube, cache, _ = await started(c, tmp_path)
    try:
        names = []
        for i in range(6):  # across several watches
            names.append(c.store.create_pod(pod(f"p{i}"))["metadata"]["name"])
            c.store.create_pod(pod(f"x{i}", "other"))  # seen by the watcher only through bookmarks
            await asyncio.sleep(0.4)
        await until(lambda: sorted(p["metadata"]["name"] for p in cache.pods()) == names)
        await until(lambda: len(watches(c)) >= 3)
        assert cache.lists == 1
        versions = [int(w.query["resourceVersion"]) for w in watches(c)]
        assert versions == sorted(versions) and versions[-1] > versions[0]
        # the last watch started from a version newer than the last pod on this node: a bookmark moved it on
        last_here = max(int(p["metadata"]["resourceVersion"]) for p in cache.pods())
        await until(lambda: int(watches(c)[-1].query["resourceVersion"]) > last_here)
    finally:
        await cache.aclose()
        await kube.aclose()


def expire_watch(number: int) -> Any:
    """Make watch request `number` ask for resourceVersion 1, which the store's short history no longer has."""
    count = [0]

    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            count[0] += 1
            if count[0] == number:
                request = request.clone(rel_url=request.rel_url.update_query(resourceVersion="1"))
        return await handler(request)
    return mw


async def test_an_expired_version_lists_again(cluster: ClusterFactory, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cache, "WATCH_TIMEOUT_S", 1)
    store = KubeStore(history_size=3)
    c = await cluster(expire_watch(2), store=store)
    for i in range(5):
        store.create_pod(pod(f"old{i}", "other"))
    kube, cache, _ = await started(c, tmp_path)
    try:
        await until(lambda: len(watches(c)) >= 2)
        late = store.create_pod(pod("late"))
        await until(lambda: cache.lists == 2)
        await until(lambda: cache.get(late["metadata"]["uid"]) is not None)
    finally:
        await cache.aclose()
        await kube.aclose()


async def test_the_client_hands_an_expired_watch_over_as_an_error_event(cluster: ClusterFactory,
                                                                       tmp_path: Path) -> None:
    store = KubeStore(history_size=2)
    c = await cluster(store=store)
    for i in range(5):
        store.create_pod(pod(f"p{i}"))
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    try:
        events = [ev async for ev in kube.watch_node_pods("n", "1", timeout_s=1)]
        assert [e["type"] for e in events] == ["ERROR"] and events[0]["object"]["code"] == 410
    finally:
        await kube.aclose()


async def test_the_watch_survives_the_api_server_going_away(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = await cluster()
    kube, cache, _ = await started(c, tmp_path)
    try:
        for r in cluster.runners:
            await r.cleanup()
        cluster.runners.clear()
        await asyncio.sleep(0.5)  # the watch fails and retries with backoff
        port = int(c.url.rsplit(":", 1)[1])
        runner = web.AppRunner(_app(c.store), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
        cluster.runners.append(runner)
        p = c.store.create_pod(pod("after"))
        await until(lambda: cache.get(p["metadata"]["uid"]) is not None, 30)
        assert cache.lists == 1  # the same API server came back: the watch resumed from its version, no list
    finally:
        await cache.aclose()
        await kube.aclose()


def _app(store: KubeStore) -> web.Application:
    from gpumgr.sim.kubeapi.routes import build_app

    return build_app(store, bookmark_interval=0.3)


async def test_cached_pods_leave_out_managed_fields(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = await cluster()
    p = c.store.create_pod(pod("p"))
    fields = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
    c.store.merge_patch_pod("default", "p", {"metadata": {"managedFields": fields, "labels": {"a": "b"}}})
    assert c.store.get_pod("default", "p")["metadata"]["managedFields"] == fields  # type: ignore[index]
    kube, cache, _ = await started(c, tmp_path)
    try:
        uid = p["metadata"]["uid"]
        assert "managedFields" not in cache.get(uid)["metadata"]  # type: ignore[index]
        c.store.merge_patch_pod("default", "p", {"metadata": {"labels": {"a": "c"}}})
        await until(lambda: (cache.get(uid) or {})["metadata"]["labels"] == {"a": "c"})
        assert "managedFields" not in cache.get(uid)["metadata"]  # type: ignore[index]
    finally:
        await cache.aclose()
        await kube.aclose()


def test_a_slow_live_list_never_revives_a_pod_the_watch_saw_deleted() -> None:
    """refresh() lists at rv 100 (pod P pending); the watch sees P deleted at rv 110, then relists at rv 120; the
    slow refresh answer arrives last. P must stay gone (it would otherwise look pending to Allocate's guess)."""

    class Never:  # the cache's client is not called in this test: its methods are driven directly
        pass

    cache = PodCache(Never(), "n")  # type: ignore[arg-type]
    p = pod("p")
    p["metadata"].update(uid="uid-p", resourceVersion="90")
    cache._replace([p], "95")
    gone = {**p, "metadata": {**p["metadata"], "resourceVersion": "110"}}
    cache._apply("DELETED", gone)
    cache._replace([], "120")
    cache._merge([p], "100")  # the slow answer of a list taken at rv 100
    assert cache.get("uid-p") is None and cache.known_finished("uid-p")
    fresh = pod("q")
    fresh["metadata"].update(uid="uid-q", resourceVersion="130")
    cache._merge([fresh], "130")  # a pod the watch has not delivered yet is added
    assert cache.get("uid-q") is not None
