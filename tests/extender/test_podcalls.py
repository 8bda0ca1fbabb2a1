"""The bind's API calls speak as the kubeconfig's user, with the request shapes the API server expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from gpumgr.extender.kubeaccess import ApiCallError, api_client
from gpumgr.extender.podcalls import PodCalls


async def recording_server(answers: dict[tuple[str, str], tuple[int, Any]]) -> tuple[web.AppRunner, str,
                                                                                      list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append({"method": request.method, "path": request.path, "headers": dict(request.headers),
                     "body": json.loads(body) if body else None})
        status, doc = answers[(request.method, request.path)]
        return web.json_response(doc, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", seen


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "s3cret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


async def test_calls_carry_the_token_and_the_api_shapes(tmp_path: Path) -> None:
    path = "/api/v1/namespaces/team-a/pods/train-0"
    runner, url, seen = await recording_server({
        ("GET", path): (200, {"metadata": {"name": "train-0", "resourceVersion": "7"}}),
        ("PATCH", path): (409, {"kind": "Status", "reason": "Conflict", "message": "the object has been modified"}),
        ("POST", path + "/binding"): (201, {"kind": "Binding"}),
    })
    calls = PodCalls(api_client(str(kubeconfig(tmp_path / "kc", url))).configuration)
    try:
        assert (await calls.get_pod("team-a", "train-0"))["metadata"]["resourceVersion"] == "7"
        with pytest.raises(ApiCallError) as err:
            await calls.patch_pod("team-a", "train-0", {"metadata": {"resourceVersion": "6"}})
        assert err.value.status == 409 and "has been modified" in str(err.value)
        await calls.bind_pod("team-a", "train-0", "uid-1", "node-9")
    finally:
        await calls.close()
        await runner.cleanup()

    assert all(s["headers"]["Authorization"].lower() == "bearer s3cret-token" for s in seen)
    assert seen[1]["headers"]["Content-Type"] == "application/merge-patch+json"
    assert seen[2]["body"] == {"apiVersion": "v1", "kind": "Binding",
                               "metadata": {"name": "train-0", "namespace": "team-a", "uid": "uid-1"},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-9"}}


async def test_an_api_that_does_not_answer_is_an_error_with_status_zero(tmp_path: Path) -> None:
    calls = PodCalls(api_client(str(kubeconfig(tmp_path / "kc", "http://127.0.0.1:9"))).configuration)
    try:
        with pytest.raises(ApiCallError) as err:
            await calls.get_pod("default", "p")
        assert err.value.status == 0
    finally:
        await calls.close()
