"""How the agent reaches the API server: a kubeconfig (TLS with client certificates, inline or in files; bearer
tokens, inline or in a file that rotates), in-cluster from a service-account folder, and what it refuses."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpumgr.kube.client import KubeClient
from gpumgr.kube.kubeconfig import KubeConfigError, in_cluster, load_kubeconfig
from gpumgr.kube.rest import ApiError
from tests.extender.certs import Certs
from tests.kube.conftest import ClusterFactory, Handler, server_tls


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def bearer(expected: list[str]) -> Any:
    """Answer 401 unless the request carries `Bearer <expected[0]>`."""
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {expected[0]}":
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized",
                                      "message": "Unauthorized"}, status=401)
        return await handler(request)
    return mw


@pytest.mark.parametrize("inline", [False, True])
async def test_tls_with_client_certificates(cluster: ClusterFactory, certs: Certs, tmp_path: Path,
                                            inline: bool) -> None:
    c = await cluster(tls=server_tls(certs, client_certs=True))
    c.store.create_node({"metadata": {"name": "n"}})
    if inline:
        cl = {"certificate-authority-data": b64(certs.ca)}
        user = {"client-certificate-data": b64(certs.client_crt), "client-key-data": b64(certs.client_key)}
    else:  # relative paths are taken from the kubeconfig's folder
        (tmp_path / "pki").symlink_to(certs.ca.parent)
        cl = {"certificate-authority": f"pki/{certs.ca.name}"}
        user = {"client-certificate": f"pki/{certs.client_crt.name}", "client-key": f"pki/{certs.client_key.name}"}
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc", cl, user)))
    try:
        node = await kube.get_node("n")
        assert node is not None and node["metadata"]["name"] == "n"
        # the official client, for the DRA front end, is made from the same settings
        from kubernetes import client

        got = await asyncio.to_thread(client.CoreV1Api(kube.api_client).read_node, "n", _request_timeout=10)
        assert got.metadata.name == "n"
    finally:
        await kube.aclose()

    anonymous = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc2", cl)))
    try:
        with pytest.raises(aiohttp.ClientError):
            await anonymous.get_node("n")
    finally:
        await anonymous.aclose()


async def test_a_server_of_another_ca_is_refused_unless_told_to_skip_verification(
        cluster: ClusterFactory, certs: Certs, tmp_path: Path) -> None:
    c = await cluster(tls=server_tls(certs, client_certs=False))
    c.store.create_node({"metadata": {"name": "n"}})
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc", {"certificate-authority": str(certs.stranger_crt)})))
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await kube.get_node("n")
    finally:
        await kube.aclose()
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc", {"insecure-skip-tls-verify": True})))
    try:
        assert await kube.get_node("n") is not None
    finally:
        await kube.aclose()


async def test_a_rotated_token_file_is_read_again(cluster: ClusterFactory, tmp_path: Path) -> None:
    expected = ["first"]
    c = await cluster(bearer(expected))
    c.store.create_node({"metadata": {"name": "n"}})
    token = tmp_path / "token"
    token.write_text("first\n")
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc", user={"tokenFile": str(token)})))
    try:
        assert await kube.get_node("n") is not None
        # the kubelet swaps the file (a new inode)
        (tmp_path / "token.new").write_text("second")
        os.replace(tmp_path / "token.new", token)
        expected[0] = "second"
        before = len(c.seen)
        assert await kube.get_node("n") is not None
        assert len(c.seen) == before + 1  # the new token went with the first try
        # rewritten in place with the same size and time: only the server's 401 tells; read again and retry once
        st = token.stat()
        token.write_text("thirdx")
        os.utime(token, ns=(st.st_atime_ns, st.st_mtime_ns))
        expected[0] = "thirdx"
        before = len(c.seen)
        assert await kube.get_node("n") is not None
        assert len(c.seen) == before + 2
        official = kube.api_client.configuration
        assert official.get_api_key_with_prefix("BearerToken") == "Bearer thirdx"
        expected[0] = "wrong"
        with pytest.raises(ApiError) as e:
            await kube.get_node("n")
        assert e.value.status == 401
    finally:
        await kube.aclose()


async def test_in_cluster_from_the_service_account_folder(cluster: ClusterFactory, certs: Certs,
                                                          tmp_path: Path) -> None:
    expected = ["sa-token"]
    c = await cluster(bearer(expected), tls=server_tls(certs, client_certs=False))
    c.store.create_node({"metadata": {"name": "n"}})
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(certs.ca.read_bytes())
    (sa / "token").write_text("sa-token")
    port = c.url.rsplit(":", 1)[1]
    kube = KubeClient(in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}, str(sa)))
    try:
        assert await kube.get_node("n") is not None
        (sa / "token").write_text("rotated-token")
        expected[0] = "rotated-token"
        assert await kube.get_node("n") is not None
    finally:
        await kube.aclose()


def test_in_cluster_needs_the_service_environment_and_folder(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster({}, str(tmp_path))
    with pytest.raises(KubeConfigError, match="service-account CA"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, str(tmp_path))
    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(KubeConfigError):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, str(tmp_path))
    (tmp_path / "ca.crt").write_text("")  # an empty CA file trusts nothing: never the system's roots instead
    with pytest.raises(KubeConfigError, match="ca.crt.*empty"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, str(tmp_path))


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "kubeconfig"
    p.write_text(text)
    return str(p)


CONFIG = """
apiVersion: v1
kind: Config
current-context: c
clusters: [{name: k, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
users: [{name: u, user: %s}]
"""


@pytest.mark.parametrize(("user", "field"), [
    ("{exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}", "users[u].user.exec"),
    ("{auth-provider: {name: gcp}}", "users[u].user.auth-provider"),
    ("{username: a, password: b}", "users[u].user.username"),
])
def test_unsupported_credentials_name_the_file_and_the_field(tmp_path: Path, user: str, field: str) -> None:
    path = write(tmp_path, CONFIG % user)
    with pytest.raises(KubeConfigError) as e:
        load_kubeconfig(path)
    assert path in str(e.value) and field in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("text", "words"), [
    ("not: [valid", "not valid YAML"),
    ("- a list", "not a kubeconfig"),
    (CONFIG.replace("current-context: c", "current-context: other") % "{}", "no context named 'other'"),
    (CONFIG.replace('"https://127.0.0.1:6443"', "ftp://x") % "{}", "must be an https:// or http:// URL"),
    (CONFIG.replace("insecure-skip-tls-verify: true", "proxy-url: http://p") % "{}", "cluster.proxy-url"),
    (CONFIG % "{client-certificate-data: '%%%'}", "is not base64"),
    (CONFIG % "{client-certificate: /nonexistent.crt, client-key: /nonexistent.key}", "cannot be loaded"),
    (CONFIG % "{client-certificate: /nonexistent.crt}", "without a key"),
    (CONFIG % "{tokenFile: /nonexistent-token}", "cannot read token file"),
])
def test_bad_kubeconfigs_are_one_clear_line(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(KubeConfigError) as e:
        load_kubeconfig(path)
    assert words in str(e.value) and path in str(e.value), str(e.value)


def test_the_agent_refuses_an_unusable_kubeconfig_with_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text("defaults: {model: T4, memory_mib: 16384}\ngpus: [{}]\ntopology: {levels: [[X]]}\n")
    for kc, words in ((write(tmp_path, CONFIG % "{exec: {command: x}}"), "users[u].user.exec"),
                      (str(tmp_path / "missing"), "cannot read")):
        p = subprocess.run([sys.executable, "-m", "gpumgr.cli", "run", "--node-name", "n1", "--kubeconfig", kc,
                            "--simulate", str(spec), "--checkpoint-dir", str(tmp_path / "c")],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr and words in p.stderr and kc in p.stderr
        assert "kubernetes" not in p.stderr


def test_a_kubeconfig_alias_bomb_is_refused_while_loading_and_never_printed(tmp_path: Path) -> None:
    # An alias bomb: ~400 bytes that expand to 9^6 strings if the error message prints the value.
    bomb = 'a: &a ["xxxxxxxxxx","xxxxxxxxxx","xxxxxxxxxx","xxxxxxxxxx","xxxxxxxxxx","xxxxxxxxxx"]\n'
    for name, prev in zip("bcdef", "abcde", strict=True):
        bomb += f"{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
    bomb += ("clusters: [{name: c, cluster: {server: *f}}]\n"
             "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n")
    path = tmp_path / "config"
    path.write_text(bomb)
    with pytest.raises(KubeConfigError) as err:
        load_kubeconfig(str(path))
    msg = str(err.value)
    assert len(msg) < 400 and "\n" not in msg and "xxxxxxxxxx" not in msg
    assert "aliases" in msg and str(path) in msg  # refused while loading, naming the file and line


@pytest.mark.parametrize("ca", ["certificate-authority", "certificate-authority-data"])
def test_a_ca_together_with_insecure_skip_tls_verify_is_refused(tmp_path: Path, certs: Certs, ca: str) -> None:
    value = str(certs.ca) if ca == "certificate-authority" else b64(certs.ca)
    both = CONFIG.replace("insecure-skip-tls-verify: true", f"insecure-skip-tls-verify: true, {ca}: '{value}'")
    path = write(tmp_path, both % "{}")
    with pytest.raises(KubeConfigError) as e:  # client-go refuses it too: which of the two was meant?
        load_kubeconfig(path)
    msg = str(e.value)
    assert path in msg and "clusters[k]" in msg and "insecure-skip-tls-verify" in msg and ca.split("-data")[0] in msg
    assert "\n" not in msg
    write(tmp_path, both.replace("insecure-skip-tls-verify: true", "insecure-skip-tls-verify: false") % "{}")
    access = load_kubeconfig(path)  # the CA alone is fine
    assert access.ca_file or access.ca_data
