"""Who may call the extender: HTTPS with required client certificates (issue 9, item 1), over real TLS.

No client certificate, or one of another CA: the TLS handshake is refused. The scheduler's certificate: the
verbs work, and the kube-scheduler stand-in binds through them. Probes stay reachable on a plain-HTTP port.
The command refuses to start without authentication settings unless told so, and then warns."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpumgr.extender.server import ExtenderServer
from gpumgr.serving import tls
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.scheduler import SchedulerEmulator
from tests.extender.certs import Certs, make_certs
from tests.extender.support import args, inventory, node, pod
from tests.extender.test_cli import free_port


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "pki")


@pytest.fixture
async def secure(api: KubeApiServer, tmp_path: Path, certs: Certs) -> AsyncIterator[tuple[ExtenderServer, int]]:
    api.store.create_node(node("n", inventory(1)))
    ctx = tls.server_context(str(certs.server_crt), str(certs.server_key), str(certs.ca))
    server = ExtenderServer(str(api.write_kubeconfig(tmp_path / "kubeconfig")), tls=ctx, probe=("127.0.0.1", 0))
    port = await server.start("127.0.0.1", 0)
    await server.wait_ready(10)
    yield server, port
    await server.stop()


async def post(port: int, ctx: ssl.SSLContext | None, verb: str, body: Any) -> tuple[int, Any]:
    conn = aiohttp.TCPConnector(ssl=ctx if ctx is not None else False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=10)) as http:
        scheme = "https" if ctx is not None else "http"
        async with http.post(f"{scheme}://127.0.0.1:{port}/gpumgr/{verb}", json=body) as r:
            return r.status, await r.json(content_type=None)


async def test_no_client_certificate_is_refused_at_the_handshake(api: KubeApiServer, secure: Any,
                                                                 certs: Certs) -> None:
    server, port = secure
    p = api.store.create_pod(pod("p", [(100, 0)]))
    anonymous = tls.client_context(str(certs.ca))  # trusts the server, shows no certificate

    with pytest.raises(aiohttp.ClientError):
        await post(port, anonymous, "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "n"})
    with pytest.raises(aiohttp.ClientError):  # nor plain HTTP on the TLS port
        await post(port, None, "filter", args(p, ["n"]))
    assert api.store.get_pod("default", "p")["spec"].get("nodeName") is None  # type: ignore[index]


async def test_a_client_certificate_of_another_ca_is_refused(api: KubeApiServer, secure: Any, certs: Certs) -> None:
    server, port = secure
    api.store.create_pod(pod("p", [(100, 0)]))
    stranger = tls.client_context(str(certs.ca), str(certs.stranger_crt), str(certs.stranger_key))

    with pytest.raises(aiohttp.ClientError):
        await post(port, stranger, "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "n"})
    assert api.store.get_pod("default", "p")["spec"].get("nodeName") is None  # type: ignore[index]


async def test_the_schedulers_certificate_schedules_and_binds(api: KubeApiServer, secure: Any, certs: Certs) -> None:
    server, port = secure
    p = api.store.create_pod(pod("p", [(30, 8)]))
    ctx = tls.client_context(str(certs.ca), str(certs.client_crt), str(certs.client_key))
    sched = SchedulerEmulator(f"https://127.0.0.1:{port}/gpumgr", tls=ctx)

    decision = await sched.schedule(p, ["n"])

    assert decision.node == "n", decision.reasons
    assert api.store.get_pod("default", "p")["spec"]["nodeName"] == "n"  # type: ignore[index]


async def test_probes_answer_on_the_plain_probe_port_only(secure: Any) -> None:
    server, port = secure
    assert server.probe_port
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for path in ("/healthz", "/readyz"):
            async with http.get(f"http://127.0.0.1:{server.probe_port}{path}") as r:
                assert r.status == 200, path
        async with http.post(f"http://127.0.0.1:{server.probe_port}/gpumgr/bind", json={}) as r:
            assert r.status in (404, 405) and "Error" in await r.json()


def test_an_in_process_server_without_client_authentication_is_refused(certs: Certs) -> None:
    with pytest.raises(ValueError, match="--insecure-serve-without-auth"):
        ExtenderServer("unused")
    no_client_ca = tls.server_context(str(certs.server_crt), str(certs.server_key))
    with pytest.raises(ValueError, match="client certificates"):
        ExtenderServer("unused", tls=no_client_ca)


def gpumgr(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpumgr.cli", "extender", *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


def test_the_command_refuses_to_serve_without_authentication_settings(tmp_path: Path, certs: Certs) -> None:
    cases: list[tuple[list[str], dict[str, str], str]] = [
        ([], {}, "--tls-cert-file, --tls-key-file and --client-ca-file"),
        (["--tls-cert-file", str(certs.server_crt), "--tls-key-file", str(certs.server_key)], {}, "--client-ca-file"),
        (["--client-ca-file", str(certs.ca)], {}, "--tls-cert-file"),
        (["--tls-cert-file", str(certs.server_crt), "--tls-key-file", str(tmp_path / "nokey"),
          "--client-ca-file", str(certs.ca)], {}, "no such file"),
        (["--tls-cert-file", str(certs.server_crt), "--tls-key-file", str(certs.server_key),
          "--client-ca-file", str(certs.server_key)], {}, "--client-ca-file"),
        (["--insecure-serve-without-auth", "--max-body-bytes", "lots"], {}, "--max-body-bytes 'lots'"),
        ([], {"GPUMGR_INSECURE_SERVE_WITHOUT_AUTH": "true", "GPUMGR_BODY_TIMEOUT": "-1"}, "timeouts must be"),
        ([], {"GPUMGR_INSECURE_SERVE_WITHOUT_AUTH": "true", "GPUMGR_HEADER_TIMEOUT": "inf"}, "and finite"),
    ]
    for argv, env, words in cases:
        proc = gpumgr(*argv, env=env)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, (argv, err)
        assert words in err, (argv, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


async def test_the_insecure_flag_serves_plain_http_and_warns(api: KubeApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    proc = gpumgr("--listen", f"127.0.0.1:{free_port()}", "--kubeconfig", str(kubeconfig),
                  "--insecure-serve-without-auth")
    try:
        assert proc.stderr is not None
        loop = asyncio.get_running_loop()
        lines: list[str] = []
        while not any("listening on" in line for line in lines):
            line = await loop.run_in_executor(None, proc.stderr.readline)
            assert line, "".join(lines)
            lines.append(line)
        listening = lines[-1]
        after: list[str] = []  # the watch thread may log a line ("listed 0 pods") before the warning
        while len(after) < 8 and not any("WITHOUT client authentication" in line for line in after):
            line = await loop.run_in_executor(None, proc.stderr.readline)
            assert line, "".join(lines + after)
            after.append(line)
        warning = next(line for line in after if "WITHOUT client authentication" in line)
        assert "WARNING" in warning, warning
        assert "http://127.0.0.1:" in listening
    finally:
        proc.terminate()
        proc.wait(timeout=20)
