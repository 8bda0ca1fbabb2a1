"""Fixtures: throwaway certificates made with the openssl CLI, and a webhook served in-process over HTTPS."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpumgr.webhook.server import TlsFiles, WebhookServer


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def make_cert(directory: Path, name: str, cn: str = "localhost", ca: Pair | None = None) -> Pair:
    """A self-signed certificate for localhost and 127.0.0.1, or one signed by `ca` (for client certificates)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    common = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
              "-subj", f"/CN={cn}"]
    if ca is None:
        cmd = ["openssl", "req", "-x509", *common, "-days", "2", "-out", str(cert),
               "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
        subprocess.run(cmd, check=True, capture_output=True)
    else:
        csr = directory / f"{name}.csr"
        subprocess.run(["openssl", "req", "-new", *common, "-out", str(csr)], check=True, capture_output=True)
        subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
                        "-CAcreateserial", "-days", "2", "-out", str(cert)], check=True, capture_output=True)
    return Pair(cert, key)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    return make_cert(tmp_path_factory.mktemp("webhook-certs"), "server")


def client_context(ca: Path, client: Pair | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


@dataclass
class Webhook:
    server: WebhookServer
    url: str
    http: aiohttp.ClientSession

    async def post_raw(self, body: bytes, path: str = "/mutate") -> tuple[int, Any]:
        async with self.http.post(self.url + path, data=body,
                                  headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json(content_type=None)

    async def review(self, doc: Any) -> dict[str, Any]:
        import json

        status, answer = await self.post_raw(json.dumps(doc).encode())
        assert status == 200, answer
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        return dict(answer["response"])


@pytest.fixture
async def webhook(certs: Pair) -> AsyncIterator[Webhook]:
    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key)), max_body_bytes=256 * 1024)
    port = await server.start("127.0.0.1", 0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(certs.cert))) as http:
        yield Webhook(server, f"https://127.0.0.1:{port}", http)
    await server.stop()
