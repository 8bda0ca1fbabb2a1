"""The plugins register before the agent has listed the node's pods (a slow API server must not delay the kubelet
seeing the devices), but nothing is handed out until the pods are listed and the start-up reconcile is done."""

from __future__ import annotations

import asyncio
from typing import Any

from gpumgr import podspec
from gpumgr.agent.daemon import Agent
from gpumgr.kube.client import KubeClient
from tests.e2e.harness import sim_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


class SlowList(KubeClient):
    """The first pod list takes as long as the test says."""

    def __init__(self, base: KubeClient, release: asyncio.Event):
        super().__init__(base.access)
        self.release = release

    async def list_node_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        await self.release.wait()
        return await super().list_node_pods(node)


async def test_plugins_register_before_the_pod_list_and_allocate_waits_for_it() -> None:
    async with sim_node("gtx1080ti", start_agent=False) as node:
        release = asyncio.Event()
        node.kube = SlowList(KubeClient.connect(str(node.kubeconfig)), release)
        node.agent = Agent(node.config, node.backend, node.kube)
        starting = asyncio.create_task(node.agent.start())
        for res in (CORE, MEM):
            await node.kubelet.wait_registered(res, timeout=20)
        await node.kubelet.wait_for(lambda: bool(node.kubelet.devices(CORE)), 20)
        assert not starting.done() and not node.agent.ready

        pod = node.create_pod("early", [("main", 50, 4)])
        admitting = asyncio.create_task(node.admit(pod))
        await asyncio.sleep(0.5)
        assert not admitting.done()  # GetPreferredAllocation / Allocate wait for the pod list
        assert not node.agent.state.ledger.allocations

        release.set()
        await asyncio.wait_for(starting, 20)
        admitted = await asyncio.wait_for(admitting, 20)
        assert admitted is not None and len(node.agent.state.ledger.allocations) == 1
        assert node.agent.ready
