"""A small cluster in one process for `both` mode end to end: one Kubernetes API test server; simulated nodes
whose real agent (`gpumgr run --mode both`) serves the vcuda device plugins to a kubelet emulator and DRA claims
to a DRA kubelet emulator, from one ledger; the real scheduler extender (`--dra-claims on`) over HTTP; and the
DRA scheduler stand-in for claims.

    async with both_cluster([NodeDef("node-a", (1, 0)), NodeDef("node-b", (0, 1))]) as c:
        await c.run_claim(["node-a"], "train", 60, "8Gi")   # stand-in allocates, NodePrepareResources
        decision = await c.place("gm", 50, 16)              # extender filter, prioritize, bind over HTTP
        await c.admit("gm")                                 # kubelet Allocate + PreStartContainer over gRPC

`stale_cache()` + `allocate_claim_from()` let the DRA stand-in decide on an older view of the cluster, as a
scheduler racing the extender does. `usage_from_api()`, `usage_from_ledgers()` and `usage_from_extender()` say
what each card holds, read three ways, for the final sums.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumgr.allocator import Ledger
from gpumgr.devices.types import GPU, Inventory
from gpumgr.dra.config import DRIVER_NAME
from gpumgr.extender.claims import pod_claim
from gpumgr.extender.server import ExtenderServer
from gpumgr.requests import podspec
from gpumgr.requests.quantity import parse_int
from gpumgr.sim.dra_scheduler import DraScheduler
from gpumgr.sim.kubeapi import KubeApiServer, KubeStore
from gpumgr.sim.kubelet import AdmittedPod
from gpumgr.sim.kubelet.dra_kubelet import DraKubelet, RunningDraPod
from gpumgr.sim.node import SimNode
from gpumgr.sim.scheduler import Decision, SchedulerEmulator
from tests.dra.harness import device_classes, share_request

NS = "default"
CARD_MIB = 16384
UNIT_MIB = 256
MIB = 2**20
WAIT_S = 30.0


@dataclass(frozen=True)
class NodeDef:
    name: str
    minors: tuple[int, ...]  # /dev/nvidiaN of card index 0, 1, ...: not always the index


@dataclass(frozen=True)
class CardUse:
    cores: int
    memory_mib: int


@dataclass
class ClusterNode:
    sim: SimNode  # API objects, kubelet emulator (device plugins), the agent in `both` mode
    dra: DraKubelet  # the kubelet's DRA side for the same node


@dataclass
class Cluster:
    api: KubeApiServer
    nodes: dict[str, ClusterNode]
    extender: ExtenderServer
    scheduler: SchedulerEmulator
    dra_scheduler: DraScheduler
    dra_pods: dict[str, RunningDraPod] = field(default_factory=dict)

    # -- DRA claims ------------------------------------------------------------------------------------------
    def create_claim(self, name: str, cores: int, memory: str) -> dict[str, Any]:
        spec = {"devices": {"requests": [share_request(memory=memory, cores=cores)]}}
        return self.api.store.create_object("resourceclaims", {"metadata": {"name": name}, "spec": spec}, NS)

    def create_claim_pod(self, name: str, claim: str) -> dict[str, Any]:
        return self.api.store.create_pod({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})

    def allocate_claim(self, nodes: Sequence[str], name: str, cores: int, memory: str) -> str:
        """A claim and a pod using it, allocated and bound by the stand-in on the first of `nodes` that fits
        (Unschedulable, with nothing written, when none does); not prepared yet. Returns the node."""
        self.create_claim(name, cores, memory)
        self.create_claim_pod(f"{name}-pod", name)
        return self.dra_scheduler.schedule_pod(NS, f"{name}-pod", list(nodes))

    async def prepare_claim(self, node: str, name: str) -> RunningDraPod:
        """The node's kubelet starts the claim's pod: NodePrepareResources (DraPrepareError when refused)."""
        self.dra_pods[name] = await self.nodes[node].dra.run_pod(NS, f"{name}-pod")
        return self.dra_pods[name]

    def drop_claim_pod(self, name: str) -> None:
        """The claim's pod is deleted before it ran; the stand-in deallocates the claim nobody reserves now."""
        pod = self.api.store.get_pod(NS, f"{name}-pod")
        assert pod is not None
        self.api.store.delete_pod(NS, f"{name}-pod")
        self.dra_scheduler.release_pod(NS, pod)

    def stale_cache(self) -> KubeStore:
        """What a DRA scheduler's informers hold now: device classes, ResourceSlices, claims (with status). A
        stand-in over it decides as kube-scheduler does when it has not seen later changes yet."""
        cache = KubeStore()
        for resource in ("deviceclasses", "resourceslices", "resourceclaims"):
            for obj in self.api.store.list_resource(resource):
                meta = obj["metadata"]
                body = {k: v for k, v in obj.items() if k != "metadata"}
                body["metadata"] = {"name": meta["name"]}
                cache.create_object(resource, body, meta.get("namespace"))
        return cache

    def allocate_claim_from(self, cache: KubeStore, node: str, name: str, cores: int, memory: str) -> str:
        """A claim allocated on `node` by a stand-in deciding on `cache`, written to the cluster as kube-scheduler
        writes it (status.allocation, then the claim's pod reserved and bound). Returns the device."""
        spec = {"devices": {"requests": [share_request(memory=memory, cores=cores)]}}
        cache.create_object("resourceclaims", {"metadata": {"name": name}, "spec": spec}, NS)
        decided = DraScheduler(cache).allocate_claim(NS, name, node)
        self.api.store.create_object("resourceclaims", {"metadata": {"name": name}, "spec": spec,
                                                        "status": {"allocation": decided["status"]["allocation"]}},
                                     NS)
        self.create_claim_pod(f"{name}-pod", name)
        self.dra_scheduler.schedule_pod(NS, f"{name}-pod", [node])  # already allocated: reserve and bind only
        return self.claim_device(name)

    async def run_claim(self, nodes: Sequence[str], name: str, cores: int, memory: str) -> tuple[str, str]:
        """`allocate_claim`, then `prepare_claim` on the node chosen. Returns the node and the device
        (gpu-<index>)."""
        node = self.allocate_claim(nodes, name, cores, memory)
        await self.prepare_claim(node, name)
        return node, self.claim_device(name)

    def claim(self, name: str) -> dict[str, Any]:
        got = self.api.store.get_object("resourceclaims", name, NS)
        assert got is not None, f"claim {name} is gone"
        return got

    def claim_device(self, name: str) -> str:
        [result] = self.claim(name)["status"]["allocation"]["devices"]["results"]
        return str(result["device"])

    def slice_device(self, node: str, device: str) -> dict[str, Any] | None:
        """The device as the node's ResourceSlice publishes it now (None: not offered)."""
        for s in self.api.store.list_resource("resourceslices"):
            if (s.get("spec") or {}).get("nodeName") == node:
                for d in s["spec"].get("devices") or []:
                    if d["name"] == device:
                        return dict(d)
        return None

    # -- gpu-manager pods ------------------------------------------------------------------------------------
    def create_gm_pod(self, name: str, cores: int, units: int) -> dict[str, Any]:
        """A gpu-manager pod, not bound: the extender places it. It is created through the first node's helper
        only to reuse its pod builder; `bind=False` leaves it on no node."""
        any_node = next(iter(self.nodes.values()))
        return any_node.sim.create_pod(name, [("main", cores, units)], bind=False)

    async def place(self, name: str, cores: int, units: int, nodes: Sequence[str] | None = None) -> Decision:
        """Filter, prioritize and bind through the extender's HTTP API, as kube-scheduler does (over `nodes`,
        default all)."""
        pod = self.create_gm_pod(name, cores, units)
        return await self.scheduler.schedule(pod, list(self.nodes) if nodes is None else list(nodes))

    def pod(self, name: str) -> dict[str, Any]:
        got = self.api.store.get_pod(NS, name)
        assert got is not None, f"pod {name} is gone"
        return got

    async def admit(self, name: str) -> AdmittedPod:
        """The bound pod's node admits it: the kubelet emulator calls Allocate and PreStartContainer."""
        pod = self.pod(name)
        return await self.nodes[pod["spec"]["nodeName"]].sim.admit(pod)

    def visible_minors(self, name: str, admitted: AdmittedPod) -> list[int]:
        """The cards (minors) the node gave the pod's container, from the Allocate answer's environment."""
        node = self.nodes[self.pod(name)["spec"]["nodeName"]].sim
        resp = admitted.container("main").responses[podspec.RESOURCE_CORE]
        uuids = dict(resp.envs)["NVIDIA_VISIBLE_DEVICES"].split(",")
        by_uuid = {g.uuid: g.minor for g in node.inventory.gpus}
        return sorted(by_uuid[u] for u in uuids)

    def ledger(self, node: str) -> Ledger:
        """The node agent's ledger (the one both front ends change)."""
        agent = self.nodes[node].sim.agent
        assert agent is not None and agent.state is not None, f"the agent of {node} is not running"
        return agent.state.ledger

    # -- sums ------------------------------------------------------------------------------------------------
    def usage_from_api(self) -> dict[tuple[str, int], CardUse]:
        """(node, card index) -> what the API objects say is held there: allocated claims of our driver
        (consumedCapacity; absent = the whole card) plus gpu-manager pods (predicate annotations, asks)."""
        cores: dict[tuple[str, int], int] = {}
        memory: dict[tuple[str, int], int] = {}
        for c in self.api.store.list_resource("resourceclaims"):
            allocation = (c.get("status") or {}).get("allocation") or {}
            for r in (allocation.get("devices") or {}).get("results") or []:
                if r.get("driver") != DRIVER_NAME:
                    continue
                key = (str(r["pool"]), int(str(r["device"]).removeprefix("gpu-")))
                consumed = r.get("consumedCapacity") or {}
                cores[key] = cores.get(key, 0) + (parse_int(consumed["cores"]) if "cores" in consumed else 100)
                mib = -(-parse_int(consumed["memory"]) // MIB) if "memory" in consumed else CARD_MIB
                memory[key] = memory.get(key, 0) + mib
        for p in self.api.store.list_pods():
            held = pod_claim(p)
            if held is None:
                continue
            node = self.nodes[held.node].sim
            for h in held.held:
                per_card = h.cores if h.cores < 100 else 100
                for minor in h.minors:
                    index = next(g.index for g in node.inventory.gpus if g.minor == minor)
                    key = (held.node, index)
                    cores[key] = cores.get(key, 0) + per_card
                    mib = h.memory_units * UNIT_MIB if h.cores < 100 else CARD_MIB
                    memory[key] = memory.get(key, 0) + mib
        return {k: CardUse(cores[k], memory[k]) for k in cores}

    def usage_from_ledgers(self) -> dict[tuple[str, int], CardUse]:
        """(node, card index) -> what each agent's ledger holds there (cards nobody holds left out)."""
        out = {}
        for name in self.nodes:
            for card in self.ledger(name).cards:
                if card.holders:
                    used_mib = sum(h.memory_mib for h in card.holders.values())
                    out[(name, card.index)] = CardUse(card.used_cores, used_mib)
        return out

    def usage_from_extender(self) -> dict[tuple[str, int], CardUse]:
        """(node, card index) -> what the extender's view of each node holds there."""
        out = {}
        for name in self.nodes:
            for card in self.extender.view.nodes[name].ledger.cards:
                if card.holders:
                    used_mib = sum(h.memory_mib for h in card.holders.values())
                    out[(name, card.index)] = CardUse(card.used_cores, used_mib)
        return out


def inventory(minors: Sequence[int], node: str) -> Inventory:
    """16 GiB cards with the given minors, joined by NVLink in pairs (as tests.dra.harness.inventory)."""
    n = len(minors)
    gpus = tuple(GPU(index=i, uuid=f"GPU-{node}-{i:04d}", minor=m, name="NVIDIA A16", memory_mib=CARD_MIB,
                     bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0)
                 for i, m in enumerate(minors))
    levels = tuple(tuple("X" if i == j else ("NV2" if i // 2 == j // 2 else "SYS") for j in range(n))
                   for i in range(n))
    return Inventory(gpus=gpus, levels=levels, driver_version="550.54.15", cuda_driver_version="12.4")


async def until(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll `check` until it holds; fail naming `what` after `timeout` seconds (a bound, not a measurement)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _agent_extra(root: Path) -> dict[str, str]:
    return {"mode": "both", "cdi_dir": str(root / "cdi"), "dra_plugin_dir": str(root / "plugins" / DRIVER_NAME),
            "plugins_registry_dir": str(root / "registry")}


@contextlib.asynccontextmanager
async def both_cluster(defs: Sequence[NodeDef]) -> AsyncIterator[Cluster]:
    top = Path(tempfile.mkdtemp(prefix="bc", dir="/tmp"))  # unix socket paths must stay under 108 bytes
    api = KubeApiServer()
    nodes: dict[str, ClusterNode] = {}
    extender: ExtenderServer | None = None
    try:
        await api.start()
        for dc in device_classes():
            api.store.create_object("deviceclasses", dc)
        for i, d in enumerate(defs):
            root = top / f"n{i}"
            sim = SimNode(root, inventory(d.minors, d.name), node_name=d.name, api=api, extra=_agent_extra(root))
            dra = DraKubelet(root / "registry", [root / "cdi"], api.store, d.name)
            nodes[d.name] = ClusterNode(sim, dra)
            await sim.start()
            await dra.start()
            await dra.wait_driver(DRIVER_NAME)
        kubeconfig = api.write_kubeconfig(top / "kubeconfig")
        extender = ExtenderServer(str(kubeconfig), policy="binpack", insecure=True,
                                  scheduler_name="default-scheduler", dra_claims="on")
        port = await extender.start("127.0.0.1", 0)
        await extender.wait_ready(WAIT_S)
        ext = extender
        await until(lambda: all(n in ext.view.nodes and ext.view.nodes[n].shape is not None for n in nodes),
                    "the extender to see every node's GPU inventory")
        await until(lambda: {(s.get("spec") or {}).get("nodeName")
                             for s in api.store.list_resource("resourceslices")} >= set(nodes),
                    "every node's ResourceSlice")
        yield Cluster(api, nodes, extender, SchedulerEmulator(f"http://127.0.0.1:{port}/gpumgr"),
                      DraScheduler(api.store))
    finally:
        if extender is not None:
            await extender.stop()
        for n in nodes.values():
            await n.dra.stop()
            await n.sim.stop()
        await api.stop()
        shutil.rmtree(top, ignore_errors=True)


__all__ = ["MIB", "NS", "CARD_MIB", "UNIT_MIB", "Cluster", "CardUse", "NodeDef", "both_cluster", "until"]
