"""N fake GPU nodes of 8 cards on a real API server: Node objects with capacity, the agent's inventory and cordon
annotations (device-plugin path) and one ResourceSlice per node built by the agent's own code (DRA path).

Three kinds of board in turn: V100-SXM2 32 GB (hybrid cube mesh: one NVLink domain), RTX A6000 48 GB (NVLink
pairs under PCIe) and H100 80 GB (all NVLink). Every 10th node has card 7 unhealthy, every 7th node card 0
cordoned. A cordoned card is tainted in the slice like an unhealthy one (reason `cordoned`), so the three paths
offer the same cards; `example.com/gpu` counts only the cards that are neither.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.devices.types import Inventory
from gpumgr.dra.slices import build_spec
from gpumgr.node import inventory as node_inventory
from gpumgr.requests import podspec
from gpumgr.requests.choices import ANN_CORDON

TOPO = Path(__file__).resolve().parents[2] / "fixtures" / "topo"
BASELINE_RESOURCE = "example.com/gpu"
DRIVER = "vgpu.gpumgr.io"
UNIT_MIB = 256
WRITERS = 8
BOARDS = (
    ("dgx1-like_8x-v100-sxm2_hybrid-cube-mesh_mlx5.txt", "Tesla V100-SXM2-32GB", 32768),
    ("baobab-gpu048_8x-rtxa6000_nvlink-pairs_2socket_2nic.txt", "NVIDIA RTX A6000", 49140),
    ("h100-8x_hgx_12nic_numa-off_tabs.txt", "NVIDIA H100 80GB HBM3", 81559),
)


def board_inventories() -> list[Inventory]:
    return [inventory_from_topo_file(TOPO / f, memory_mib=mib, model=model) for f, model, mib in BOARDS]


def plan(count: int) -> list[FakeNode]:
    boards = board_inventories()
    nodes = []
    for i in range(count):
        unhealthy = frozenset({7}) if i % 10 == 9 else frozenset()
        cordoned = frozenset({0}) if i % 7 == 6 else frozenset()
        nodes.append(FakeNode(f"gpu-{i:05d}", boards[i % len(boards)], unhealthy, cordoned))
    return nodes


def node_body(n: FakeNode) -> dict[str, Any]:
    usable = [g for g in n.inventory.gpus if g.index in n.usable]
    gpus = {BASELINE_RESOURCE: str(len(usable)), podspec.RESOURCE_CORE: str(100 * len(usable)),
            podspec.RESOURCE_MEMORY: str(sum(g.memory_mib // UNIT_MIB for g in usable))}
    capacity = {"cpu": "128", "memory": "1Ti", "pods": "250", **gpus}
    annotations = {podspec.ANN_NODE_INVENTORY: node_inventory.encode(n.inventory, n.unhealthy, UNIT_MIB)}
    if n.cordoned:
        annotations[ANN_CORDON] = ",".join(str(i) for i in sorted(n.cordoned))
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n.name, "annotations": annotations,
                         "labels": {"kubernetes.io/hostname": n.name, "nvidia.com/gpu.present": "true"}},
            "status": {"capacity": capacity, "allocatable": capacity}}


def slice_body(n: FakeNode, generation: int = 1,
               held_elsewhere: dict[int, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The slice the agent publishes; `held_elsewhere`: card -> (cores, MiB) of device-plugin pods (`both`)."""
    reasons = {i: "XID-79" for i in n.unhealthy} | {i: "cordoned" for i in n.cordoned}
    spec = build_spec(n.inventory, n.name, DRIVER, reasons, UNIT_MIB, generation, held_elsewhere)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{n.name}-{DRIVER}"}, "spec": spec}


def write(make_client: Any, nodes: list[FakeNode], now: str) -> None:
    """Create every Node (status with capacity and a Ready condition, no taint) and its ResourceSlice, 8 writers at
    once."""
    def one(chunk: list[FakeNode]) -> None:
        from kubernetes import client as k

        api_client = make_client()
        core: Any = k.CoreV1Api(api_client)
        custom: Any = k.CustomObjectsApi(api_client)
        for n in chunk:
            body = node_body(n)
            status = body.pop("status")
            core.create_node(body)
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "fake node of the scale bench", "lastHeartbeatTime": now,
                                     "lastTransitionTime": now}]
            core.patch_node_status(n.name, {"status": status})
            # the API server's TaintNodesByCondition taints a new node not-ready; the node-lifecycle
            # controller, which would lift it once the node is Ready, does not run here
            core.patch_node(n.name, {"spec": {"taints": []}})
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", slice_body(n))

    chunks = [nodes[i::WRITERS] for i in range(WRITERS)]
    with ThreadPoolExecutor(WRITERS) as pool:
        for future in [pool.submit(one, c) for c in chunks if c]:
            future.result()


@dataclass(frozen=True)
class FakeNode:
    name: str
    inventory: Inventory
    unhealthy: frozenset[int]
    cordoned: frozenset[int]

    @property
    def usable(self) -> frozenset[int]:
        return frozenset(g.index for g in self.inventory.gpus) - self.unhealthy - self.cordoned
