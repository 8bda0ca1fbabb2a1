"""The cluster's CA file is projected into the pod and replaced by the kubelet when the root CA rotates (and given a
new inode, same content, at every token refresh): the next new connection trusts the new file, a running watch goes
on over its old connection, a broken file keeps the CA loaded before (one warning), a failed reload is tried
again. Client certificate files given by a kubeconfig are watched the same way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import ssl
import uuid
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpumgr.kube.client import KubeClient
from gpumgr.kube.kubeconfig import in_cluster
from tests.extender.certs import Certs
from tests.helpers import until
from tests.kube.conftest import Cluster, ClusterFactory, Handler, server_tls


def other_ca(certs: Certs) -> bytes:
    """A second self-signed CA, which did not sign the server's certificate."""
    path = certs.ca.with_name("other-ca.crt")
    assert path.is_file() and path != certs.ca
    return path.read_bytes()


def swap(path: Path, data: bytes) -> None:
    """Replace the file the way the kubelet updates a projected volume: a new file renamed over the old."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def in_pod(c: Cluster, tmp_path: Path, ca: bytes) -> tuple[KubeClient, Path]:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    swap(sa / "ca.crt", ca)
    port = c.url.rsplit(":", 1)[1]
    access = in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}, str(sa))
    return KubeClient(access), sa / "ca.crt"


async def one_request_per_connection(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await handler(request)
    resp.force_close()  # every call makes a new connection, so every call shows which CA new connections trust
    return resp


def disconnected(request: web.Request) -> bool:
    return request.protocol.transport is None


async def test_the_next_connection_trusts_the_rotated_ca_file(cluster: ClusterFactory, certs: Certs, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    c = await cluster(one_request_per_connection, tls=server_tls(certs, client_certs=False))
    c.store.create_node({"metadata": {"name": "n"}})
    kube, ca = in_pod(c, tmp_path, other_ca(certs))  # the server's certificate is signed by the cluster CA
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await kube.get_node("n")
        swap(ca, certs.ca.read_bytes())  # the CA rotates to the one that signed the server
        assert await kube.get_node("n") is not None

        # a file that cannot be loaded: new connections keep the last good CA, and the log says so once
        caplog.set_level(logging.WARNING, logger="gpumgr.kube")
        swap(ca, b"not a certificate\n")
        for _ in range(3):
            assert await kube.get_node("n") is not None
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and str(ca) in warned[0] and "in-cluster" in warned[0], warned

        swap(ca, other_ca(certs))  # the next good version is taken again
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await kube.get_node("n")
    finally:
        await kube.aclose()


async def added(events: AsyncGenerator[dict[str, Any], None], name: str) -> None:
    async def until_added() -> None:
        async for ev in events:
            if ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == name:
                return
        raise AssertionError("the watch ended")
    await asyncio.wait_for(until_added(), 10)


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "x"}]}}


async def test_a_running_watch_outlives_a_ca_rotation(cluster: ClusterFactory, certs: Certs, tmp_path: Path) -> None:
    c = await cluster(tls=server_tls(certs, client_certs=False))
    c.store.create_node({"metadata": {"name": "n"}})
    kube, ca = in_pod(c, tmp_path, certs.ca.read_bytes())
    try:
        _, rv = await kube.list_node_pods("n")
        async with contextlib.aclosing(kube.watch_node_pods("n", rv, 30)) as events:
            c.store.create_pod(pod("a"))
            await added(events, "a")
            watch = next(r for r in reversed(c.seen) if r.query.get("watch") == "true")
            assert await kube.get_node("n") is not None
            idle = c.seen[-1]  # another connection, kept alive after its answer
            assert idle.protocol is not watch.protocol
            assert await kube.get_node("n") is not None
            assert c.seen[-1].protocol is idle.protocol  # reused while the CA stays

            swap(ca, other_ca(certs))
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # a new connection, with the new CA
                await kube.get_node("n")
            c.store.create_pod(pod("b"))
            await added(events, "b")  # the watch goes on over its connection
            assert not disconnected(watch)

            swap(ca, certs.ca.read_bytes())
            assert await kube.get_node("n") is not None
            assert c.seen[-1].protocol is not idle.protocol  # connections made before the change are not reused
        await until(lambda: disconnected(watch))
    finally:
        await kube.aclose()


async def test_a_ca_file_reprojected_with_the_same_content_changes_nothing(
        cluster: ClusterFactory, certs: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = await cluster(tls=server_tls(certs, client_certs=False))
    c.store.create_node({"metadata": {"name": "n"}})
    kube, ca = in_pod(c, tmp_path, certs.ca.read_bytes())
    caplog.set_level(logging.DEBUG, logger="gpumgr.kube")
    try:
        assert await kube.get_node("n") is not None
        first, tls = c.seen[-1], kube.access.tls_context()
        for _ in range(3):  # the kubelet refreshes the token: every file of the volume is written again
            swap(ca, certs.ca.read_bytes())
            assert await kube.get_node("n") is not None
            assert c.seen[-1].protocol is first.protocol  # the same connection, kept alive
        assert kube.access.tls_context() is tls
        assert [r.getMessage() for r in caplog.records] == []
    finally:
        await kube.aclose()


def server_tls_for_two_cas(certs: Certs) -> ssl.SSLContext:
    """The server asks for a client certificate, of the cluster CA or of the other one (whose CN it records)."""
    ctx = server_tls(certs, client_certs=True)
    ctx.load_verify_locations(cadata=other_ca(certs).decode())
    return ctx


def client_cn(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    assert peer, "no client certificate"
    return next(v for rdn in peer["subject"] for k, v in rdn if k == "commonName")


async def test_a_rotated_client_certificate_is_used_by_new_connections(
        cluster: ClusterFactory, certs: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = await cluster(one_request_per_connection, tls=server_tls_for_two_cas(certs))
    c.store.create_node({"metadata": {"name": "n"}})
    crt, key = tmp_path / "client.crt", tmp_path / "client.key"
    swap(crt, certs.client_crt.read_bytes())
    swap(key, certs.client_key.read_bytes())
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc", {"certificate-authority": str(certs.ca)},
                                               {"client-certificate": str(crt), "client-key": str(key)})))
    caplog.set_level(logging.INFO, logger="gpumgr.kube")
    try:
        assert await kube.get_node("n") is not None
        assert client_cn(c.seen[-1]) == "kube-scheduler"

        swap(crt, certs.stranger_crt.read_bytes())  # the certificate is renewed first, its key a moment later
        for _ in range(2):
            assert await kube.get_node("n") is not None  # meanwhile the pair loaded before is used
            assert client_cn(c.seen[-1]) == "kube-scheduler"
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "client certificate/key" in warned[0] and "CA" not in warned[0], warned

        swap(key, certs.stranger_key.read_bytes())
        assert await kube.get_node("n") is not None
        assert client_cn(c.seen[-1]) == "stranger"
        changed = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert len(changed) == 1 and str(key) in changed[0] and str(certs.ca) not in changed[0], changed
    finally:
        await kube.aclose()


@contextlib.contextmanager
def no_file_can_be_opened() -> Iterator[None]:
    """The process is out of file descriptors (EMFILE) for a moment: a failure that changes no file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def trusted(ctx: ssl.SSLContext | None) -> list[str]:
    assert ctx is not None
    cas: list[Any] = ctx.get_ca_certs()
    return [v for cert in cas for rdn in cert["subject"] for k, v in rdn if k == "commonName"]


def test_a_reload_that_failed_is_tried_again(certs: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    swap(sa / "ca.crt", certs.ca.read_bytes())
    access = in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}, str(sa))
    before = access.tls_context()
    assert trusted(before) == ["cluster-ca"]

    swap(sa / "ca.crt", other_ca(certs))  # the CA rotates, and the first read of the new file fails
    with no_file_can_be_opened():
        assert access.tls_context() is before
        assert access.tls_context() is before
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "ca.crt" in warned[0], warned  # once for this version of the file

    assert trusted(access.tls_context()) == ["other-ca"]  # the change is not lost: it is taken once it can be
