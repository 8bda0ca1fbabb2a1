"""The agent's API calls through gpumgr.kube.client against the API test server: what each returns, what is
None or False (gone), and what is retried (409) or raised."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpumgr.kube.client import CONFLICT_RETRIES, POD_CONDITION, KubeClient
from gpumgr.kube.rest import ApiError
from gpumgr.sim.kubeapi import write_kubeconfig
from tests.kube.conftest import ClusterFactory, Handler


def pod(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}


async def test_list_is_narrowed_to_the_node_and_carries_a_resource_version(cluster: ClusterFactory,
                                                                        tmp_path: Path) -> None:
    c = await cluster()
    for i in range(3):
        c.store.create_pod(pod(f"a{i}", "node-a"))
    c.store.create_pod(pod("b", "node-b"))
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    try:
        pods, rv = await kube.list_node_pods("node-a")
        assert sorted(p["metadata"]["name"] for p in pods) == ["a0", "a1", "a2"]
        assert rv == str(c.store.resource_version)
        assert c.seen[-1].query["fieldSelector"] == "spec.nodeName=node-a"
    finally:
        await kube.aclose()


async def test_missing_objects_are_none_or_false_and_other_errors_raise(cluster: ClusterFactory,
                                                                       tmp_path: Path) -> None:
    c = await cluster()
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    try:
        assert await kube.get_pod("default", "nope") is None
        assert await kube.get_node("nope") is None
        assert await kube.patch_pod_annotations("default", "nope", {"a": "b"}) is False
        assert await kube.fail_pod("default", "nope", "R", "m") is False
        with pytest.raises(ApiError) as e:
            await kube.patch_node_metadata("nope", labels={"a": "b"})
        assert e.value.status == 404 and e.value.reason == "NotFound"
        with pytest.raises(ApiError) as e:
            await kube.rest.request("GET", "/api/v1/widgets")
        assert e.value.status == 404
    finally:
        await kube.aclose()


async def test_patches_merge_and_events_are_recorded(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = await cluster()
    p = c.store.create_pod(pod("p", "n"))
    c.store.merge_patch_pod("default", "p", {"metadata": {"annotations": {"keep": "1", "drop": "2"}},
                                             "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    c.store.create_node({"metadata": {"name": "n", "labels": {"x": "1"}}})
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    try:
        assert await kube.patch_pod_annotations("default", "p", {"new": "3", "drop": None})
        assert (await kube.get_pod("default", "p") or {})["metadata"]["annotations"] == {"keep": "1", "new": "3"}

        assert await kube.fail_pod("default", "p", "GPUShare", "cannot fit")
        status = c.store.get_pod("default", "p")["status"]  # type: ignore[index]
        assert status["phase"] == "Failed" and status["reason"] == "GPUShare"
        assert {cd["type"] for cd in status["conditions"]} == {"Ready", POD_CONDITION}  # merged by type

        await kube.patch_node_metadata("n", labels={"y": "2", "x": None}, annotations={"a": "b"})
        node = await kube.get_node("n")
        assert node is not None and node["metadata"]["labels"] == {"y": "2"}
        assert node["metadata"]["annotations"] == {"a": "b"}

        await kube.record_event(p, "Why", "because")
        ev = c.store.list_events("default")
        assert len(ev) == 1 and ev[0]["reason"] == "Why" and ev[0]["involvedObject"]["uid"] == p["metadata"]["uid"]
    finally:
        await kube.aclose()


def conflicts(times: int) -> Any:
    left = [times]

    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "PATCH" and left[0] > 0:
            left[0] -= 1
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
                                      "reason": "Conflict", "message": "the object has been modified"}, status=409)
        return await handler(request)
    return mw


async def test_conflicts_are_retried_then_raised(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = await cluster(conflicts(CONFLICT_RETRIES - 1))
    c.store.create_pod(pod("p", "n"))
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    try:
        assert await kube.patch_pod_annotations("default", "p", {"a": "1"})
        assert c.store.get_pod("default", "p")["metadata"]["annotations"] == {"a": "1"}  # type: ignore[index]
    finally:
        await kube.aclose()

    c = await cluster(conflicts(CONFLICT_RETRIES))
    c.store.create_pod(pod("p", "n"))
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc2")))
    try:
        with pytest.raises(ApiError) as e:
            await kube.patch_pod_annotations("default", "p", {"a": "1"})
        assert e.value.status == 409
        assert sum(r.method == "PATCH" for r in c.seen) == CONFLICT_RETRIES
    finally:
        await kube.aclose()


async def test_a_black_holed_server_fails_the_call_instead_of_hanging(tmp_path: Path) -> None:
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read the request, never answer

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    kube = KubeClient.connect(str(kc))
    kube.rest.read_timeout = 0.5
    try:
        # the client's own read timeout ends the call (the outer bound, a plain TimeoutError, only guards the test)
        with pytest.raises(aiohttp.ServerTimeoutError):
            await asyncio.wait_for(kube.get_node("n"), 20)

        async def watch() -> None:
            async for _ in kube.rest.watch("/api/v1/pods", {}, read_timeout=0.5):
                pass
        with pytest.raises(aiohttp.ServerTimeoutError):
            await asyncio.wait_for(watch(), 20)
    finally:
        await kube.aclose()
        server.close()
        for w in held:
            w.close()


@pytest.mark.parametrize(("status", "chunked"), [(500, False), (500, True), (200, True)])
async def test_an_oversized_answer_is_refused_not_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           status: int, chunked: bool) -> None:
    from gpumgr.kube import rest

    monkeypatch.setattr(rest, "MAX_ANSWER_BYTES", 1 << 20)
    big = b"x" * (2 << 20)  # over both caps (64 KiB for an error, 1 MiB here for an answer)

    async def handler(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(status=status, body=big)
        resp = web.StreamResponse(status=status)
        resp.enable_chunked_encoding()  # no Content-Length: refused while reading
        await resp.prepare(request)
        for i in range(0, len(big), 65536):
            await resp.write(big[i:i + 65536])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    kube = KubeClient.connect(str(kc))
    try:
        with pytest.raises(ApiError) as e:
            await kube.rest.request("GET", "/api/v1/pods")
        assert e.value.reason == "BadResponse" and "bytes" in e.value.message and len(str(e.value)) < 200
        if status >= 400:  # a watch refused with a huge error body is capped the same way
            with pytest.raises(ApiError) as e:
                async for _ in kube.rest.watch("/api/v1/pods", {}, read_timeout=5):
                    pass
            assert e.value.reason == "BadResponse" and len(str(e.value)) < 200
    finally:
        await kube.aclose()
        await runner.cleanup()
