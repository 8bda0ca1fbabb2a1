"""Fixtures: the Kubernetes API test server and an extender started in-process against it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpumgr.extender.kubeaccess import api_client
from gpumgr.extender.leader import ElectionSettings, Elector
from gpumgr.extender.podcalls import PodCalls
from gpumgr.extender.server import ExtenderServer
from gpumgr.sim.kubeapi import KubeApiServer


@dataclass
class Extender:
    server: ExtenderServer
    url: str  # base URL including the prefix
    root: str  # base URL without the prefix
    http: aiohttp.ClientSession

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        async with self.http.post(f"{self.url}/{verb}", json=body) as r:
            return r.status, await r.json(content_type=None)

    async def filter(self, body: Any) -> dict[str, Any]:
        status, doc = await self.post("filter", body)
        assert status == 200, doc
        return doc

    async def prioritize(self, body: Any) -> dict[str, int]:
        status, doc = await self.post("prioritize", body)
        assert status == 200, doc
        return {h["Host"]: h["Score"] for h in doc}

    async def bind(self, p: dict[str, Any], node: str) -> str:
        meta = p["metadata"]
        status, doc = await self.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                               "PodUID": meta["uid"], "Node": node})
        assert status == 200, doc
        return str(doc["Error"])


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(bookmark_interval=1.0) as server:
        yield server


@pytest.fixture
async def start_extender(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Extender]]]:
    started: list[Extender] = []
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

    async def start(policy: str = "binpack", prefix: str = "/gpumgr", **kw: Any) -> Extender:
        kw.setdefault("insecure", True)
        server = ExtenderServer(str(kubeconfig), policy=policy, prefix=prefix, **kw)
        port = await server.start("127.0.0.1", 0)
        ext = Extender(server, f"http://127.0.0.1:{port}{server.prefix}", f"http://127.0.0.1:{port}",
                       aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)))
        started.append(ext)
        await server.wait_ready(10)
        return ext

    yield start
    for ext in started:
        await ext.http.close()
        await ext.server.stop()


# -- leader election, step by step (tests/extender/test_ha_election.py, test_ha_fences.py) --------------------
ELECTION_NS = "gpu-system"


@pytest.fixture
async def calls(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[PodCalls]:
    """The extender's own API calls (Lease and pod calls) against the API test server."""
    client = api_client(str(api.write_kubeconfig(tmp_path / "calls-kubeconfig")))
    pc = PodCalls(client.configuration)
    yield pc
    await pc.close()
    client.close()


@pytest.fixture
def make(calls: PodCalls) -> Callable[..., Elector]:
    """make(identity, clock, lease_api=None, on_elected=None): an Elector with the chart's timings (15/10/2)."""
    def make(identity: str, clock: Callable[[], float], lease_api: Any = None,
             on_elected: Callable[[], Awaitable[None]] | None = None) -> Elector:
        settings = ElectionSettings(identity=identity, namespace=ELECTION_NS, lease_duration=15, renew_deadline=10,
                                    retry_period=2)
        return Elector(settings, lease_api or calls, clock=clock, on_elected=on_elected)

    return make
