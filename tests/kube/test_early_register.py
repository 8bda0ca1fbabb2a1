"""The plugins register before the agent has listed the node's pods (a slow API server must not delay the kubelet
seeing the devices), but nothing is handed out until the pods are listed and the start-up reconcile is done; when
the pods cannot be listed at all, GPU calls are refused (UNAVAILABLE) rather than answered from a ledger the
start-up reconcile has not checked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpumgr.agent import daemon
from gpumgr.agent.daemon import Agent
from gpumgr.deviceplugin import servicer
from gpumgr.kube.client import KubeClient
from gpumgr.requests import podspec
from gpumgr.sim.kubelet.admission import AdmissionError
from tests.e2e.harness import sim_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


class SlowList(KubeClient):
    """The pod list waits for the test's word."""

    def __init__(self, base: KubeClient, release: asyncio.Event):
        super().__init__(base.access)
        self.release = release

    async def list_node_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        await self.release.wait()
        return await super().list_node_pods(node)


async def registered(node: Any) -> None:
    for res in (CORE, MEM):
        await node.kubelet.wait_registered(res, timeout=20)
    await node.kubelet.wait_for(lambda: bool(node.kubelet.devices(CORE)) and bool(node.kubelet.devices(MEM)), 20)


async def test_allocate_waits_for_the_start_up_reconcile_not_only_the_pod_list(monkeypatch) -> None:
    """The pods are listed at once, but the start-up reconcile is held: nothing may be handed out meanwhile."""
    held = asyncio.Event()
    real = daemon.reconcile

    async def held_at_start(service: Any, synced: Any, grace: float, why: str, **kw: Any) -> Any:
        if why == "start":
            await held.wait()
        return await real(service, synced, grace, why, **kw)

    monkeypatch.setattr(daemon, "reconcile", held_at_start)
    async with sim_node("gtx1080ti", start_agent=False) as node:
        node.kube = KubeClient.connect(str(node.kubeconfig))
        node.agent = Agent(node.config, node.backend, node.kube)
        starting = asyncio.create_task(node.agent.start())
        await registered(node)
        assert not starting.done() and not node.agent.ready

        admitting = asyncio.create_task(node.admit(node.create_pod("early", [("main", 50, 4)])))
        await asyncio.sleep(0.5)
        assert not admitting.done()  # GetPreferredAllocation / Allocate wait for the start-up reconcile
        assert not node.agent.state.ledger.allocations

        held.set()
        await asyncio.wait_for(starting, 20)
        admitted = await asyncio.wait_for(admitting, 20)
        assert admitted is not None and len(node.agent.state.ledger.allocations) == 1
        assert node.agent.ready


async def test_pods_never_listed_means_unavailable_until_they_are(monkeypatch) -> None:
    monkeypatch.setattr(daemon, "POD_SYNC_TIMEOUT_S", 0.5)
    monkeypatch.setattr(servicer, "READY_WAIT_S", 1.0)
    async with sim_node("gtx1080ti", start_agent=False) as node:
        release = asyncio.Event()
        node.kube = SlowList(KubeClient.connect(str(node.kubeconfig)), release)
        node.agent = Agent(node.config, node.backend, node.kube)
        await asyncio.wait_for(node.agent.start(), 20)  # the agent runs on (metrics, health) ...
        await registered(node)
        assert not node.agent.ready  # ... but says it is not ready, and hands nothing out
        with pytest.raises(AdmissionError) as e:
            await asyncio.wait_for(node.admit(node.create_pod("refused", [("main", 50, 4)])), 20)
        assert "still starting" in str(e.value)
        assert not node.agent.state.ledger.allocations

        release.set()
        for _ in range(400):  # the agent's readiness is not a kubelet change: poll it
            if node.agent.ready:
                break
            await asyncio.sleep(0.05)
        assert node.agent.ready
        admitted = await asyncio.wait_for(node.admit(node.create_pod("later", [("main", 50, 4)])), 20)
        assert admitted is not None and len(node.agent.state.ledger.allocations) == 1
