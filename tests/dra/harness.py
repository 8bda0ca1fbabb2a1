"""One simulated node for the DRA tests: the API test server (real `kubernetes` client), the DRA front end over a
real NodeState (ledger + checkpoint) and vDevice manager, the kubelet DRA emulator over unix sockets, and the
scheduler stand-in. No GPU, no cluster: everything else is the real code."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import config

from gpumgr.devices.types import GPU, Inventory
from gpumgr.dra.config import DRIVER_NAME, DraConfig
from gpumgr.dra.frontend import DraFrontEnd
from gpumgr.dra.kubeaccess import DraKube
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from gpumgr.sim.dra_scheduler import DraScheduler
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet.dra_kubelet import DraKubelet, RunningDraPod
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.server import VDeviceManager

NODE = "dra-node"
NS = "default"
GIB = 2**30
CARD_MIB = 16384
SHARED_CLASS = "vgpu.gpumgr.io"
WHOLE_CLASS = "gpu.gpumgr.io"


def inventory(n: int = 4) -> Inventory:
    """`n` 16 GiB cards; NVLink pairs (0,1), (2,3), ...; pairs joined through the CPU (SYS)."""
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000", minor=i, name="NVIDIA A16",
                     memory_mib=CARD_MIB, bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=i // 2)
                 for i in range(n))
    levels = tuple(tuple("X" if i == j else ("NV2" if i // 2 == j // 2 else "SYS") for j in range(n))
                   for i in range(n))
    return Inventory(gpus=gpus, levels=levels, driver_version="550.54.15", cuda_driver_version="12.4")


def device_classes() -> list[dict[str, Any]]:
    selector = [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": SHARED_CLASS},
         "spec": {"selectors": selector}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": WHOLE_CLASS},
         "spec": {"selectors": selector}},
    ]


def share_request(name: str = "gpu", memory: str = "4Gi", cores: int = 30, cls: str = SHARED_CLASS) \
        -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls,
                                      "capacity": {"requests": {"memory": memory, "cores": str(cores)}}}}


def whole_request(name: str = "gpu", count: int = 1) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": WHOLE_CLASS, "count": count}}


DraNodeT = TypeVar("DraNodeT", bound="DraNode")


class DraNode:
    def __init__(self, root: Path, n_gpus: int = 4):
        self.root = root
        self.api = KubeApiServer()
        self.inventory = inventory(n_gpus)
        self.cfg = DraConfig(node_name=NODE, cdi_dir=root / "cdi", plugin_dir=root / "plugins" / DRIVER_NAME,
                             registry_dir=root / "registry", dev_root=root / "dev", driver_dir=str(root / "driver"),
                             shim_dir=str(root / "shim"))
        self.state: NodeState | None = None
        self.vdevices: VDeviceManager | None = None
        self.layout = VDeviceLayout(root / "vm")
        self.fe: DraFrontEnd | None = None
        self.kubelet = DraKubelet(self.cfg.registry_dir, [self.cfg.cdi_dir], self.api.store, NODE)
        self.scheduler = DraScheduler(self.api.store)
        self.api_client: Any = None

    async def start(self) -> DraNode:
        await self.api.start()
        kubeconfig = self.api.write_kubeconfig(self.root / "kubeconfig")
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        for dc in device_classes():
            self.api.store.create_object("deviceclasses", dc)
        await self.start_agent()
        await self.kubelet.start()
        await self.kubelet.wait_driver(DRIVER_NAME)
        await self.wait_slice()
        return self

    async def wait_slice(self, timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.api.store.list_resource("resourceslices"):
            assert loop.time() < deadline, "the agent published no ResourceSlice"
            await asyncio.sleep(0.02)

    async def start_agent(self) -> DraFrontEnd:
        store = CheckpointStore(self.root / "ckpt")
        state = NodeState(NODE, self.inventory, store)
        loaded = store.load().snapshot
        if loaded is not None:
            state.ledger = loaded.ledger
        self.state = state
        self.vdevices = VDeviceManager(self.layout)
        self.fe = DraFrontEnd(self.cfg, state, self.layout, self.vdevices, DraKube(self.api_client))
        await self.fe.start()
        return self.fe

    async def stop_agent(self) -> None:
        if self.fe is not None:
            await self.fe.stop()
            self.fe = None
        if self.vdevices is not None:
            await self.vdevices.stop_all()
        if self.state is not None:
            self.state.close()

    async def stop(self) -> None:
        await self.kubelet.stop()
        await self.stop_agent()
        if self.api_client is not None:
            self.api_client.close()
        await self.api.stop()

    # -- cluster actions ----------------------------------------------------------------------------------
    def create_claim(self, name: str, requests: Sequence[dict[str, Any]],
                     constraints: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        spec: dict[str, Any] = {"devices": {"requests": list(requests)}}
        if constraints:
            spec["devices"]["constraints"] = list(constraints)
        return self.api.store.create_object("resourceclaims", {"metadata": {"name": name}, "spec": spec}, NS)

    def create_template(self, name: str, requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return self.api.store.create_object("resourceclaimtemplates", {
            "metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": list(requests)}}}}, NS)

    def create_pod(self, name: str, claims: dict[str, dict[str, str]],
                   containers: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """`claims`: pod claim name -> {"resourceClaimName": ...} or {"resourceClaimTemplateName": ...};
        `containers`: container -> the pod claim names it uses (default: one container `main` using all)."""
        containers = containers or {"main": list(claims)}
        return self.api.store.create_pod({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"resourceClaims": [{"name": k, **v} for k, v in claims.items()],
                     "containers": [{"name": c, "image": "cuda", "resources": {"claims": [{"name": x} for x in used]}}
                                    for c, used in containers.items()]}})

    async def run_pod(self, name: str, claims: dict[str, dict[str, str]],
                      containers: dict[str, list[str]] | None = None) -> RunningDraPod:
        self.create_pod(name, claims, containers)
        self.scheduler.schedule_pod(NS, name, [NODE])
        return await self.kubelet.run_pod(NS, name)

    async def delete_pod(self, name: str) -> dict[str, str]:
        pod = self.api.store.get_pod(NS, name)
        errors = await self.kubelet.delete_pod(NS, name)
        if pod is not None:
            self.api.store.delete_pod(NS, name)
            self.scheduler.release_pod(NS, pod)
        return errors

    def claim(self, name: str) -> dict[str, Any]:
        got = self.api.store.get_object("resourceclaims", name, NS)
        assert got is not None
        return got

    def dra_allocations(self) -> dict[str, Any]:
        assert self.state is not None
        return {k: a for k, a in self.state.ledger.allocations.items() if k.startswith("dra/")}


def short_root() -> Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path can be too long."""
    return Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_node(make: Callable[[Path], DraNodeT]) -> AsyncIterator[DraNodeT]:
    """A DraNode (or a subclass) made by `make` in a short temporary root, started, and always stopped and removed."""
    root = short_root()
    n = make(root)
    await n.start()
    try:
        yield n
    finally:
        await n.stop()
        remove_root(root)
