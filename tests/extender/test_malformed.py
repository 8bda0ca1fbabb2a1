"""Malformed and hostile requests: a 4xx with a JSON body naming the problem, and nothing changed."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumgr.requests import podspec
from gpumgr.serving.body import Limits
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, inventory, node, pod


async def raw(ext: Any, path: str, data: bytes, method: str = "POST") -> tuple[int, Any]:
    async with ext.http.request(method, path, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, json.loads(await r.read())


async def seeded(api: KubeApiServer, start_extender: Any, **kw: Any) -> tuple[Any, dict[str, Any]]:
    api.store.create_node(node("n", inventory(1)))
    p = api.store.create_pod(pod("p", [(100, 0)]))
    return await start_extender(**kw), p


async def test_bodies_the_extender_cannot_use_get_400(api: KubeApiServer, start_extender: Any) -> None:
    ext, p = await seeded(api, start_extender)
    ok = args(p, ["n"])
    cases: list[tuple[str, Any, str]] = [
        ("filter", b"not json", "not JSON"),
        ("filter", b"", "not JSON"),
        ("filter", [1, 2], "JSON object"),
        ("filter", {"NodeNames": ["n"]}, "missing key Pod"),
        ("filter", {"Pod": p}, "NodeNames"),
        ("filter", {"Pod": "p", "NodeNames": ["n"]}, "Pod must be"),
        ("filter", dict(ok, NodeNames="n"), "NodeNames must be an array"),
        ("filter", dict(ok, NodeNames=[1, 2]), "NodeNames[0]"),
        ("filter", dict(ok, NodeNames=["x" * 300]), "NodeNames[0]"),
        ("filter", dict(ok, NodeNames=["n"] * 20_001), "at most 20000"),
        ("filter", dict(ok, Nodes={"items": [{"metadata": {}}]}, NodeNames=None), "Nodes.items[0].metadata.name"),
        ("filter", dict(ok, Nodes={"items": [1]}), "not both"),
        ("filter", {"Pod": dict(p, spec={"containers": "all"}), "NodeNames": ["n"]}, "containers must be"),
        ("filter", {"Pod": dict(p, spec={"containers": [{"resources": {"limits": [1]}}]}), "NodeNames": ["n"]},
         "limits must be"),
        ("filter", {"Pod": pod("q", [(0, 0)]) | {"metadata": {"annotations": {"a": 1}}}, "NodeNames": ["n"]},
         "annotations"),
        ("prioritize", {"Pod": pod("q", [(0, 0)]) | {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {podspec.RESOURCE_CORE: "1.5"}}}]}}, "NodeNames": ["n"]},
         "whole-number"),
        ("prioritize", {"Pod": p, "NodeNames": None, "Nodes": None}, "NodeNames"),
        ("bind", {"PodName": "p", "PodNamespace": "default", "PodUID": ""}, "missing key Node"),
        ("bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": 7}, "Node must be a string"),
        ("bind", {"PodName": "", "PodNamespace": "default", "PodUID": "", "Node": "n"}, "PodName must not be"),
        ("bind", ["p"], "JSON object"),
        ("filter", b"[" * 30_000 + b"]" * 30_000, "nested deeper than 64 levels"),
        ("filter", b"[" + b"[]," * 70_000 + b"[]]", "objects and arrays; at most 43690"),
        # issue 18 finding 1: numbers, strings and keys count too, not only objects and arrays
        ("filter", b"[" + b"0," * 300_000 + b"0]", "objects and arrays; at most 43690"),
        ("filter", b'{"Pod":{"metadata":{"annotations":{' + b",".join(b'"a%d":""' % i for i in range(30_000))
         + b'}}},"NodeNames":["n"]}', "objects and arrays; at most 43690"),
    ]
    for verb, body, words in cases:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, doc = await raw(ext, f"{ext.url}/{verb}", data)
        assert status == 400, (verb, words, doc)
        assert words in doc["Error"], (verb, words, doc)
    assert api.store.get_pod("default", "p")["spec"].get("nodeName") is None  # type: ignore[index]


async def test_oversized_bodies_and_wrong_routes_are_json_errors(api: KubeApiServer, start_extender: Any) -> None:
    ext, _ = await seeded(api, start_extender, limits=Limits(max_body_bytes=64 * 1024))

    status, doc = await raw(ext, f"{ext.url}/filter", b'{"Pod": {}, "NodeNames": [' + b'"n",' * 50_000 + b'"n"]}')
    assert status == 413 and "larger than the limit" in doc["Error"]
    status, doc = await raw(ext, f"{ext.url}/filter", b"{}", method="GET")
    assert status == 405 and doc["Error"]
    status, doc = await raw(ext, f"{ext.root}/nope/filter", b"{}")
    assert status == 404 and doc["Error"]


async def test_health_endpoints(api: KubeApiServer, start_extender: Any) -> None:
    ext, _ = await seeded(api, start_extender)
    for path in ("/healthz", "/readyz"):
        async with ext.http.get(f"{ext.root}{path}") as r:
            assert r.status == 200, path
            assert (await r.json())["status"] in ("alive", "ready")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
pod_like = st.fixed_dictionaries({
    "metadata": st.one_of(json_values, st.fixed_dictionaries({"annotations": json_values, "uid": json_values})),
    "spec": st.one_of(json_values, st.fixed_dictionaries({"containers": st.one_of(json_values, st.lists(
        st.fixed_dictionaries({"name": json_values, "resources": st.one_of(json_values, st.fixed_dictionaries({
            "limits": st.one_of(json_values, st.dictionaries(
                st.sampled_from([podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY]), json_values))}))}),
        max_size=3))})),
})
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"Pod": st.one_of(pod_like, json_values), "NodeNames": st.one_of(json_values, st.lists(
        st.sampled_from(["n", "other", ""]), max_size=4))}),
    st.fixed_dictionaries({"PodName": json_values, "PodNamespace": json_values, "PodUID": json_values,
                           "Node": json_values}),
)


async def test_no_body_makes_the_extender_fail(api: KubeApiServer, start_extender: Any) -> None:
    ext, _ = await seeded(api, start_extender)
    seen: list[tuple[str, int]] = []
    loop_bodies: list[tuple[str, Any]] = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(verb=st.sampled_from(["filter", "prioritize", "bind"]), body=bodies)
    def collect(verb: str, body: Any) -> None:
        loop_bodies.append((verb, body))

    collect()
    for verb, body in loop_bodies:
        status, doc = await raw(ext, f"{ext.url}/{verb}", json.dumps(body).encode())
        seen.append((verb, status))
        assert status in (200, 400), (verb, body, status, doc)
        assert isinstance(doc, (dict, list)), doc
        if status == 400:
            assert doc["Error"]
    assert any(s == 400 for _, s in seen)
    assert api.store.get_pod("default", "p")["spec"].get("nodeName") is None  # type: ignore[index]
    async with aiohttp.ClientSession() as http, http.get(f"{ext.root}/healthz") as r:
        assert r.status == 200
