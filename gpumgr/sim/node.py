"""A whole simulated node in one process: the Kubernetes API test server, the kubelet emulator and the agent,
with a simulated GPU backend. Used by the end-to-end tests and by `gpumgr demo`.

    async with SimNode(workdir, spec) as node:
        pod = await node.run_pod("train", [("main", 200, 0)])
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from gpumgr.agent.config import AgentConfig
from gpumgr.agent.daemon import Agent
from gpumgr.devices.backend import Backend
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import Inventory
from gpumgr.kube.client import KubeClient
from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet import AdmittedPod, ContainerRequest, KubeletEmulator

log = logging.getLogger("gpumgr.sim")

Container = tuple[str, int, int]  # (name, vcuda-core, vcuda-memory units)


def shim_source_for(workdir: Path) -> Path:
    """The real shim when it has been built (`make -C vcuda`), else a stand-in file: the simulated node runs no
    CUDA program, it only needs the agent to find a shim to mount."""
    built = Path(__file__).resolve().parents[2] / "vcuda" / "build" / "libvcuda.so"
    if built.is_file():
        return built
    stand_in = workdir / "shim-src" / "libvcuda.so"
    stand_in.parent.mkdir(parents=True, exist_ok=True)
    stand_in.write_bytes(b"simulated node: stand-in for libvcuda.so\n")
    return stand_in


class SimNode:
    def __init__(self, workdir: Path, inventory: Inventory, node_name: str = "sim-node",
                 api: KubeApiServer | None = None, kubelet_checkpoint_format: Literal["v1", "v2"] = "v2",
                 backend: Backend | None = None, **agent_options: Any):
        self.workdir = Path(workdir)
        self.inventory = inventory
        self.node_name = node_name
        self.backend: Any = backend or SimulatedBackend(inventory)  # or the real NVML backend over the fake library
        self._own_api = api is None
        self.api = api or KubeApiServer()
        self.kubelet = KubeletEmulator(self.workdir / "dp", kubelet_checkpoint_format)
        self.kubeconfig = self.workdir / "kubeconfig"
        agent_options.setdefault("shim_dir", str(self.workdir / "vdriver"))
        agent_options.setdefault("metrics_addr", "127.0.0.1:0")
        agent_options.setdefault("driver_root", str(self.workdir / "driver-root"))
        Path(agent_options["driver_root"]).mkdir(parents=True, exist_ok=True)
        agent_options.setdefault("shim_source", str(shim_source_for(self.workdir)))
        self.config = AgentConfig(
            node_name=node_name, kubeconfig=str(self.kubeconfig), device_plugin_dir=self.workdir / "dp",
            vdevice_root=self.workdir / "vm", checkpoint_dir=self.workdir / "ckpt", dev_root=self.workdir / "dev",
            **agent_options,
        )
        self.agent: Agent | None = None
        self.kube: KubeClient | None = None

    async def start(self, agent: bool = True) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._own_api:
            await self.api.start()
        self.api.write_kubeconfig(self.kubeconfig)
        if self.api.store.get_node(self.node_name) is None:
            self.api.store.create_node({"metadata": {"name": self.node_name, "labels": {}},
                                        "status": {"capacity": {}, "allocatable": {}}})
        await self.kubelet.start()
        if agent:
            await self.start_agent()

    async def start_agent(self) -> Agent:
        self.kube = KubeClient.connect(str(self.kubeconfig))
        self.agent = Agent(self.config, self.backend, self.kube)
        await self.agent.start()
        await self.wait_plugins()
        return self.agent

    async def wait_plugins(self, timeout: float = 10.0) -> None:
        """Until both plugins are registered and the kubelet has a live device list from each (after a stream
        breaks the kubelet marks every device Unhealthy until the plugin's new stream sends its list)."""
        for res in (podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY):
            await self.kubelet.wait_registered(res, timeout=timeout)
            await self.kubelet.wait_for(self._has_devices(res), timeout)

    def _has_devices(self, resource: str) -> Callable[[], bool]:
        return lambda: "Healthy" in self.kubelet.devices(resource).values()

    async def stop_agent(self) -> None:
        if self.agent:
            await self.agent.stop()
            self.agent = None
        if self.kube:
            self.kube.close()
            self.kube = None

    async def stop(self) -> None:
        await self.stop_agent()
        await self.kubelet.stop()
        if self._own_api:
            await self.api.stop()

    async def __aenter__(self) -> SimNode:
        await self.start()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # -- pods -----------------------------------------------------------------------------------------------
    def create_pod(self, name: str, containers: Sequence[Container], namespace: str = "default",
                   annotations: Mapping[str, str] | None = None, init_containers: Sequence[Container] = (),
                   bind: bool = True) -> dict[str, Any]:
        """The pod object in the API, bound to this node (as the scheduler would have done)."""
        def spec(c: Container) -> dict[str, Any]:
            limits = {podspec.RESOURCE_CORE: str(c[1])}
            if c[2]:
                limits[podspec.RESOURCE_MEMORY] = str(c[2])
            return {"name": c[0], "image": "cuda-app", "resources": {"limits": limits, "requests": dict(limits)}}

        body: dict[str, Any] = {
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                         "annotations": dict(annotations or {})},
            "spec": {"containers": [spec(c) for c in containers]},
            "status": {"phase": "Pending"},
        }
        if init_containers:
            body["spec"]["initContainers"] = [spec(c) for c in init_containers]
        if bind:
            body["spec"]["nodeName"] = self.node_name
        return self.api.store.create_pod(body)

    async def admit(self, pod: Mapping[str, Any], resource_order: Literal["sorted", "reverse"] = "sorted",
                    start: bool = True) -> AdmittedPod:
        """The kubelet admits the pod (Allocate, PreStartContainer per container); then it runs. `resource_order`
        "reverse" allocates each container's vcuda-memory before its vcuda-core. `start=False`: admitted only,
        Pending until `start_pod` (PreStartContainer) is called."""
        def req(c: Mapping[str, Any]) -> ContainerRequest:
            limits = c.get("resources", {}).get("limits", {})
            return ContainerRequest(c["name"], {k: int(v) for k, v in limits.items() if k.startswith("tencent.com/")})

        spec = pod["spec"]
        admitted = await self.kubelet.admit_pod(pod["metadata"]["uid"], [req(c) for c in spec["containers"]],
                                                [req(c) for c in spec.get("initContainers") or []],
                                                resource_order, start)
        if start:
            self.api.store.set_pod_phase(pod["metadata"]["namespace"], pod["metadata"]["name"], "Running")
        return admitted

    async def start_pod(self, pod: Mapping[str, Any], admitted: AdmittedPod) -> None:
        """Start the containers of a pod admitted with `start=False`; then it runs."""
        await self.kubelet.start_pod(admitted)
        self.api.store.set_pod_phase(pod["metadata"]["namespace"], pod["metadata"]["name"], "Running")

    async def run_pod(self, name: str, containers: Sequence[Container], **kw: Any) -> AdmittedPod:
        pod = self.create_pod(name, containers, **kw)
        await asyncio.sleep(0)  # let the watch see it (Allocate also lists pods if it has not)
        return await self.admit(pod)

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        pod = self.api.store.get_pod(namespace, name)
        if pod is None:
            return
        self.api.store.delete_pod(namespace, name)
        await self.kubelet.remove_pod(pod["metadata"]["uid"])

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.api.store.get_pod(namespace, name)
