"""End to end over real HTTPS: the extender built from the rendered Deployment's flags and certificate files, a
kube-scheduler stand-in with the rendered stanza's tlsConfig files, and the test Kubernetes API server. The pod
is scheduled and bound only with the scheduler's certificate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpumgr.extender.server import ExtenderServer
from gpumgr.serving import tls
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.scheduler import SchedulerEmulator, SchedulingError
from tests.extender.support import inventory, node, pod

from .support import PREFIX, container, flags, render
from .test_chart_tls import EXTENDER, SCHEDULER, scheduler_stanza
from .tls_support import mounted_file


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[KubeApiServer, ExtenderServer, int, dict[str, Any]]]:
    rendered = render()
    deployment = rendered.get("Deployment", EXTENDER)
    args = flags(container(deployment, "extender")["args"])
    files = {
        flag: str(mounted_file(rendered, deployment, "extender", str(args[flag]), tmp_path / "extender"))
        for flag in ("tls-cert-file", "tls-key-file", "client-ca-file")
    }
    stanza = scheduler_stanza(rendered)
    scheduler = rendered.get("Deployment", SCHEDULER)
    client_files = {
        key: str(mounted_file(rendered, scheduler, "kube-scheduler", stanza["tlsConfig"][key], tmp_path / "sched"))
        for key in ("certFile", "keyFile", "caFile")
    }
    async with KubeApiServer(bookmark_interval=1.0) as api:
        api.store.create_node(node("n", inventory(1)))
        ctx = tls.server_context(files["tls-cert-file"], files["tls-key-file"], files["client-ca-file"])
        server = ExtenderServer(
            str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            prefix=str(args["url-prefix"]),
            tls=ctx,
            scheduler_name=str(args["scheduler-name"]),
            probe=("127.0.0.1", 0),
        )
        port = await server.start("127.0.0.1", 0)
        try:
            await server.wait_ready(10)
            yield api, server, port, client_files
        finally:
            await server.stop()


def url(port: int) -> str:
    return f"https://127.0.0.1:{port}/gpumgr"


async def test_the_rendered_scheduler_binds_through_the_rendered_extender(cluster: Any) -> None:
    api, _server, port, files = cluster
    p = api.store.create_pod(pod("p", [(30, 8)]))
    # The stand-in connects to 127.0.0.1, not to the Service name the certificate carries (tlsConfig.serverName);
    # the name check itself is tested by the handshakes of test_chart_tls.py.
    ctx = tls.client_context(files["caFile"], files["certFile"], files["keyFile"], server_name_check=False)
    decision = await SchedulerEmulator(url(port), tls=ctx).schedule(p, ["n"])
    assert decision.node == "n", decision.reasons
    assert api.store.get_pod("default", "p")["spec"]["nodeName"] == "n"


async def test_without_the_client_certificate_nothing_is_bound(cluster: Any) -> None:
    api, _server, port, files = cluster
    p = api.store.create_pod(pod("p", [(30, 8)]))
    anonymous = tls.client_context(files["caFile"], server_name_check=False)
    with pytest.raises((aiohttp.ClientError, SchedulingError)):
        await SchedulerEmulator(url(port), tls=anonymous).schedule(p, ["n"])
    assert api.store.get_pod("default", "p")["spec"].get("nodeName") is None


async def test_probes_of_the_rendered_deployment_answer_without_a_certificate(cluster: Any) -> None:
    _api, server, _port, _files = cluster
    probe = container(render().get("Deployment", f"{PREFIX}-extender"), "extender")["readinessProbe"]["httpGet"]
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(f"http://127.0.0.1:{server.probe_port}{probe['path']}") as response,
    ):
        assert response.status == 200
