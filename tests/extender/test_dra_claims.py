"""The extender counts allocated DRA ResourceClaims of vgpu.gpumgr.io (nodes in `gpumgr run --mode both`): a
gpu-manager pod is not put on a card a claim already uses. Through the extender's HTTP API, with the claims in
the API test server (resource.k8s.io/v1 ResourceClaims with status)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, eventually, inventory, node, pod

DRIVER = "vgpu.gpumgr.io"
NS = "team"
GIB = 2**30


def claim(name: str, results: list[dict[str, Any]] | None, status: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": NS},
                            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1}}]}}}
    if results is not None:
        body["status"] = {"allocation": {"devices": {"results": results}}}
    if status is not None:
        body["status"] = status
    return body


def result(node_name: str, index: int, cores: int | None = None, memory: int | None = None,
           driver: str = DRIVER) -> dict[str, Any]:
    r: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": node_name, "device": f"gpu-{index}"}
    consumed = {}
    if cores is not None:
        consumed["cores"] = str(cores)
    if memory is not None:
        consumed["memory"] = str(memory)
    if consumed:
        r["consumedCapacity"] = consumed
    return r


def cards(doc: dict[str, Any]) -> str:
    """The card (minors) the extender chose, from a filtered + bound pod's annotation."""
    return str(doc["metadata"]["annotations"].get(f"{podspec.ANN_PREDICATE_IDX}0", ""))


async def filtered(ext: Any, p: dict[str, Any], nodes: list[str]) -> tuple[list[str], dict[str, str]]:
    doc = await ext.filter(args(p, nodes))
    return doc["NodeNames"] or [], doc["FailedNodes"] or {}


async def test_an_allocated_claim_keeps_a_pod_off_its_card(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(2)))
    s.create_object("resourceclaims", claim("c", [result("n", 0, cores=60, memory=8 * GIB)]))
    s.create_object("resourceclaims", claim("whole", [result("n", 1)]))  # no consumedCapacity: the whole card
    p = s.create_pod(pod("want", [(50, 4)]))
    ext = await start_extender()

    passed, failed = await filtered(ext, p, ["n"])
    assert passed == []
    assert "needs 50 cores" in failed["n"], failed

    s.delete_object("resourceclaims", "whole", NS)  # card 1 frees: the pod goes there, not on card 0
    assert await eventually(lambda: _passes(ext, p))
    assert await ext.bind(p, "n") == ""
    assert cards(s.get_pod("default", "want") or {}) == "1"


async def _passes(ext: Any, p: dict[str, Any], nodes: tuple[str, ...] = ("n",)) -> bool:
    return (await filtered(ext, p, list(nodes)))[0] == list(nodes)


async def test_a_deleted_claim_frees_its_card(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(1)))
    s.create_object("resourceclaims", claim("c", [result("n", 0, cores=60, memory=8 * GIB)]))
    p = s.create_pod(pod("want", [(50, 4)]))
    ext = await start_extender()
    assert (await filtered(ext, p, ["n"]))[0] == []
    small = s.create_pod(pod("small", [(40, 4)]))  # 40 cores still fit next to the claim's 60
    assert (await filtered(ext, small, ["n"]))[0] == ["n"]

    s.delete_object("resourceclaims", "c", NS)

    assert await eventually(lambda: _passes(ext, p))
    assert await ext.bind(p, "n") == ""
    assert cards(s.get_pod("default", "want") or {}) == "0"


async def test_prioritize_prefers_the_node_without_the_claim(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("a", inventory(1)))
    s.create_node(node("b", inventory(1)))
    s.create_object("resourceclaims", claim("c", [result("a", 0, cores=60, memory=8 * GIB)]))
    p = s.create_pod(pod("want", [(50, 4)]))
    ext = await start_extender()

    passed, failed = await filtered(ext, p, ["a", "b"])
    assert passed == ["b"] and "a" in failed
    status, doc = await ext.post("bind", {"PodName": "want", "PodNamespace": "default",
                                          "PodUID": p["metadata"]["uid"], "Node": "a"})
    assert status == 200 and doc["Error"], doc  # bind re-checks: the claim's card has no room


async def test_claims_of_another_driver_and_unallocated_ones_are_ignored(api: KubeApiServer,
                                                                        start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(1)))
    s.create_object("resourceclaims", claim("other", [result("n", 0, driver="gpu.example.com")]))
    s.create_object("resourceclaims", claim("pending", None))
    p = s.create_pod(pod("want", [(100, 0)]))
    ext = await start_extender()

    assert (await filtered(ext, p, ["n"]))[0] == ["n"]
    assert ext.server.view.claims_on("n") == []


async def test_a_claim_for_an_unknown_node_counts_when_the_node_appears(api: KubeApiServer,
                                                                      start_extender: Any) -> None:
    s = api.store
    s.create_node(node("a", inventory(1)))
    c = s.create_object("resourceclaims", claim("c", [result("late", 0)]))
    p = s.create_pod(pod("want", [(30, 4)]))
    ext = await start_extender()
    assert ext.server.view.claims_on("late") == [c["metadata"]["uid"]]

    s.create_node(node("late", inventory(1)))

    async def refused() -> bool:
        passed, failed = await filtered(ext, p, ["late"])
        return passed == [] and "late" in failed
    assert await eventually(refused)
    assert (await filtered(ext, p, ["a"]))[0] == ["a"]


async def test_an_allocation_made_later_counts_and_a_deallocation_frees(api: KubeApiServer,
                                                                       start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(1)))
    s.create_object("resourceclaims", claim("c", None))
    p = s.create_pod(pod("want", [(100, 0)]))
    ext = await start_extender()
    assert await _passes(ext, p)

    s.merge_patch_object("resourceclaims", "c", {"status": {"allocation": {"devices": {
        "results": [result("n", 0, cores=10, memory=GIB)]}}}}, NS)
    assert await eventually(lambda: _refused(ext, p))

    s.merge_patch_object("resourceclaims", "c", {"status": {"allocation": None}}, NS)
    assert await eventually(lambda: _passes(ext, p))


async def _refused(ext: Any, p: dict[str, Any]) -> bool:
    return (await filtered(ext, p, ["n"]))[0] == []


MALFORMED: list[Any] = [
    {"allocation": "yes"},
    {"allocation": {"devices": {"results": "all"}}},
    {"allocation": {"devices": {"results": ["x"]}}},
    {"allocation": {"devices": {"results": [result("n", 0) | {"device": "card-0"}]}}},
    {"allocation": {"devices": {"results": [result("n", 0) | {"consumedCapacity": {"cores": "lots"}}]}}},
    {"allocation": {"devices": {"results": [result("n", 0) | {"consumedCapacity": {"cores": "250"}}]}}},
    {"allocation": {"devices": {"results": [result("n", 0) | {"consumedCapacity": {"memory": "-1"}}]}}},
    {"allocation": {"devices": {"results": [result("n", 0) | {"consumedCapacity": "8Gi"}]}}},
    {"allocation": {"devices": {"results": [result("n", 0)] * 33}}},  # more than the API allows
    {"allocation": {"devices": {"results": [result("n", 7)]}}},  # no such card on the node
    {"allocation": {"devices": {"results": [result("n", 0, memory=400 * GIB)]}}},  # more than the card has
]


async def test_malformed_claims_are_ignored(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(1)))
    for i, status in enumerate(MALFORMED):
        try:
            s.create_object("resourceclaims", claim(f"bad-{i}", None, status=status))
        except Exception:  # noqa: BLE001 - the API test server validates some of these itself
            continue
    p = s.create_pod(pod("want", [(100, 0)]))
    ext = await start_extender()

    assert await _passes(ext, p)
    assert await ext.bind(p, "n") == ""


async def test_off_does_not_watch_claims(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(1)))
    s.create_object("resourceclaims", claim("c", [result("n", 0)]))
    p = s.create_pod(pod("want", [(100, 0)]))
    ext = await start_extender(dra_claims="off")

    assert await _passes(ext, p)
    assert "resourceclaims" not in ext.server.view.needs


async def test_the_collector_is_back_on_once_the_view_is_ready(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(1)))
    assert gc.isenabled()
    ext = await start_extender()

    async def enabled() -> bool:
        return gc.isenabled()
    assert await eventually(enabled)
    await ext.server.stop()
    assert gc.isenabled()


@pytest.mark.parametrize("typed", [True, False], ids=["ResourceV1Api", "call_api (kubernetes 30-33)"])
async def test_a_cluster_without_resource_k8s_io_v1(api: KubeApiServer, tmp_path: Any, caplog: Any, typed: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """404 on the claims list: one log line, that watcher ends, the view is ready, a relist (a new leader)
    does not wait for it; the same with a client that has no ResourceV1Api."""
    import asyncio
    import logging

    import kubernetes.client

    if not typed:
        monkeypatch.setattr(kubernetes.client, "ResourceV1Api", None, raising=False)  # its names load lazily

    import aiohttp
    from aiohttp import web

    from gpumgr.extender.server import ExtenderServer

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/apis/resource.k8s.io"):
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound",
                                      "message": "the server could not find the requested resource"}, status=404)
        async with aiohttp.ClientSession() as session, session.request(
                request.method, api.url + request.path_qs, data=await request.read(),
                headers={k: v for k, v in request.headers.items() if k.lower() != "host"}) as up:
            out = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    text = kubeconfig.read_text().replace(api.url, f"http://127.0.0.1:{port}")
    kubeconfig.write_text(text)
    api.store.create_node(node("n", inventory(1)))
    server = ExtenderServer(str(kubeconfig), insecure=True)
    caplog.set_level(logging.INFO, logger="gpumgr.extender")
    try:
        await server.start("127.0.0.1", 0)
        await server.wait_ready(10)
        await asyncio.wait_for(server._make_current(), 10)  # the leader's relist: the ended watcher answers at once
        await asyncio.sleep(0.5)  # room for retries, which must not happen
        said = [r.getMessage() for r in caplog.records if "resourceclaims" in r.getMessage()]
        assert len(said) == 1 and "does not serve resourceclaims" in said[0], said
        assert "n" in server.view.nodes
    finally:
        await server.stop()
        await runner.cleanup()
