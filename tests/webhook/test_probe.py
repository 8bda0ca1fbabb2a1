"""The probe port (`probe=`, `--probe-listen`): `/healthz` alone over plain HTTP, so that the kubelet's probes,
which present no client certificate, succeed while `/mutate` requires one (--client-ca-file)."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import aiohttp
import pytest

from tests.webhook.conftest import Pair, client_context, make_cert
from tests.webhook.reviews import CORE, container, pod, review


async def test_probe_port_answers_healthz_without_a_client_certificate(tmp_path: Path, certs: Pair) -> None:
    from gpumgr.webhook.server import TlsFiles, WebhookServer

    ca = make_cert(tmp_path, "ca", cn="webhook-callers")
    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key), str(ca.cert)),
                           probe=("127.0.0.1", 0))
    port = await server.start("127.0.0.1", 0)
    try:
        assert server.probe_port is not None and server.probe_port != port
        probe = f"http://127.0.0.1:{server.probe_port}"
        body = json.dumps(review(pod(container("a", limits={CORE: "100"})))).encode()
        async with aiohttp.ClientSession() as http:
            async with http.get(probe + "/healthz") as r:
                assert r.status == 200 and await r.json() == {"status": "alive"}
            # the probe port serves nothing else: no way around the client certificate
            async with http.post(probe + "/mutate", data=body) as r:
                assert r.status == 404 and "error" in await r.json()
            async with http.get(probe + "/metrics") as r:
                assert r.status == 404 and "error" in await r.json()
            # the API port still refuses a caller without a certificate, /healthz included
            with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
                async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=client_context(certs.cert)) as r:
                    await r.read()
    finally:
        await server.stop()
    assert server.probe_port is None
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):  # stopped with the webhook
            async with http.get(probe + "/healthz") as r:
                await r.read()


async def test_no_probe_port_unless_asked(certs: Pair) -> None:
    from gpumgr.webhook.server import TlsFiles, WebhookServer

    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key)))
    await server.start("127.0.0.1", 0)
    try:
        assert server.probe_port is None
    finally:
        await server.stop()
