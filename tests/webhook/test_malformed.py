"""Hostile or wrong bodies: a 4xx with a JSON body naming the problem, never a traceback or a half answer."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest

from tests.webhook.conftest import Pair, Webhook, client_context, make_cert
from tests.webhook.reviews import CORE, container, pod, review


async def _bad(webhook: Webhook, body: bytes, status: int = 400) -> str:
    got, doc = await webhook.post_raw(body)
    assert got == status, doc
    assert isinstance(doc, dict) and set(doc) == {"error"}
    return str(doc["error"])


async def test_not_json(webhook: Webhook) -> None:
    assert "not JSON" in await _bad(webhook, b"{\"apiVersion\": ")
    assert "not JSON" in await _bad(webhook, b"\xff\xfe")


async def test_wrong_api_version_or_kind(webhook: Webhook) -> None:
    body = review(pod(container("a", limits={CORE: "100"})))
    for key, value in (("apiVersion", "admission.k8s.io/v1beta1"), ("kind", "Pod")):
        doc = dict(body, **{key: value})
        msg = await _bad(webhook, json.dumps(doc).encode())
        assert "admission.k8s.io/v1" in msg and "admissionReviewVersions" in msg


async def test_missing_or_wrong_request_fields(webhook: Webhook) -> None:
    good = review(pod())
    cases = [
        ([], "AdmissionReview object"),
        ({k: v for k, v in good.items() if k != "request"}, "request must be an object"),
        (dict(good, request=dict(good["request"], uid="")), "request.uid"),
        (dict(good, request=dict(good["request"], uid="u" * 500)), "request.uid"),
        (dict(good, request=dict(good["request"], object=[1])), "request.object"),
        (dict(good, request=dict(good["request"], operation=5)), "request.operation"),
        (dict(good, request=dict(good["request"], kind="Pod")), "request.kind"),
    ]
    for doc, expected in cases:
        assert expected in await _bad(webhook, json.dumps(doc).encode()), doc


async def test_nesting_is_bounded(webhook: Webhook) -> None:
    p = pod(container("a", limits={CORE: "100"}))
    deep: object = "x"
    for _ in range(100):
        deep = {"a": deep}
    p["metadata"]["annotations"] = deep
    assert "nested deeper" in await _bad(webhook, json.dumps(review(p)).encode())
    assert "nested" in await _bad(webhook, b"[" * 5_000 + b"]" * 5_000)
    assert "at most" in await _bad(webhook, b"[" * 100_000 + b"]" * 100_000)  # refused by the element count


async def test_body_size_is_bounded(webhook: Webhook) -> None:
    p = pod(container("a", limits={CORE: "100"}))
    p["metadata"]["annotations"] = {"big": "x" * (300 * 1024)}
    assert "larger than the limit" in await _bad(webhook, json.dumps(review(p)).encode(), status=413)


async def test_compressed_bodies_are_bounded_after_inflating(webhook: Webhook) -> None:
    import gzip

    good = gzip.compress(json.dumps(review(pod(container("a", limits={CORE: "100"})))).encode())
    async with webhook.http.post(webhook.url + "/mutate", data=good,
                                 headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as r:
        assert r.status == 200 and (await r.json(content_type=None))["response"]["allowed"] is True
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MiB of spaces in ~64 KB: over the 256 KiB limit
    async with webhook.http.post(webhook.url + "/mutate", data=bomb,
                                 headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as r:
        doc = await r.json(content_type=None)
        assert r.status == 413 and "expands beyond" in doc["error"], doc


async def test_wrong_method_and_path_are_json(webhook: Webhook) -> None:
    async with webhook.http.get(webhook.url + "/mutate") as r:
        assert r.status == 405 and "error" in await r.json(content_type=None)
    async with webhook.http.post(webhook.url + "/validate", data=b"{}") as r:
        assert r.status == 404 and "error" in await r.json(content_type=None)


async def test_a_bad_pod_spec_is_refused_not_crashed(webhook: Webhook) -> None:
    for spec in ({"containers": {"a": 1}}, {"containers": ["x"]}, {"containers": [{"resources": []}]},
                 {"containers": [{"resources": {"limits": [CORE]}}]}):
        resp = await webhook.review(review({"apiVersion": "v1", "kind": "Pod", "spec": spec}))
        assert resp["allowed"] is False and resp["status"]["message"], spec


async def test_plain_http_is_not_served(webhook: Webhook) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.post(webhook.url.replace("https", "http") + "/mutate", data=b"{}") as r:
                await r.read()


async def test_client_ca_requires_a_client_certificate(tmp_path, certs: Pair) -> None:  # type: ignore[no-untyped-def]
    from gpumgr.webhook.server import TlsFiles, WebhookServer

    ca = make_cert(tmp_path, "ca", cn="webhook-callers")
    apiserver = make_cert(tmp_path, "apiserver", cn="kube-apiserver", ca=ca)
    stranger = make_cert(tmp_path, "stranger", cn="stranger")
    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key), str(ca.cert)))
    port = await server.start("127.0.0.1", 0)
    try:
        body = json.dumps(review(pod(container("a", limits={CORE: "100"})))).encode()
        url = f"https://127.0.0.1:{port}/mutate"
        for client in (None, stranger):
            async with aiohttp.ClientSession() as http:
                with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
                    async with http.post(url, data=body, ssl=client_context(certs.cert, client)) as r:
                        await r.read()
        async with aiohttp.ClientSession() as http, \
                http.post(url, data=body, ssl=client_context(certs.cert, apiserver)) as r:
            assert r.status == 200 and (await r.json())["response"]["allowed"] is True
    finally:
        await server.stop()


async def test_rotated_certificate_is_served_after_reload(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpumgr.webhook.server import TlsFiles, WebhookServer

    first = make_cert(tmp_path / "a", "server")
    live = Pair(tmp_path / "live.crt", tmp_path / "live.key")
    live.cert.write_bytes(first.cert.read_bytes())
    live.key.write_bytes(first.key.read_bytes())
    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(live.cert), str(live.key)), reload_every=0)
    port = await server.start("127.0.0.1", 0)
    try:
        assert server.reload_certificates() is False  # unchanged files: nothing to do
        live.key.write_text("not a key")
        live.cert.write_text("not a certificate")
        assert server.reload_certificates() is False  # a broken pair is refused, the old one still served
        async with aiohttp.ClientSession() as http, \
                http.get(f"https://127.0.0.1:{port}/healthz", ssl=client_context(first.cert)) as r:
            assert r.status == 200
        second = make_cert(tmp_path / "b", "server")
        live.key.write_bytes(second.key.read_bytes())
        live.cert.write_bytes(second.cert.read_bytes())
        assert server.reload_certificates() is True
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=client_context(second.cert)) as r:
                assert r.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=client_context(first.cert)) as r:
                    await r.read()
    finally:
        await server.stop()


async def test_a_body_that_never_arrives_is_answered_408(certs: Pair) -> None:
    import asyncio

    from gpumgr.webhook.server import TlsFiles, WebhookServer

    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key)), read_timeout=0.2)
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(certs.cert),
                                                       server_hostname="localhost")
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"apiVersion\"")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 408"), head
        writer.close()
    finally:
        await server.stop()
