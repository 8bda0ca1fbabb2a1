"""A simulated node for the metrics tests and the bench: inventory, NodeState, simulated backend, pods and
their cgroups, all real objects (the checkpoint is written to a temp dir)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumgr.allocator.ledger import Allocation, ContainerHolder
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, GPUStatus, Inventory
from gpumgr.metrics import AgentMetrics, UsageReader
from gpumgr.node.cgroups import CgroupReader
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from tests.metrics import cgroup_trees as ct

MIB = 1 << 20
GIB = 1 << 30
MODEL = "Tesla V100-SXM2-16GB"


def inventory(n: int = 4, memory_mib: int = 16384) -> Inventory:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", minor=i, name=MODEL,
                     memory_mib=memory_mib, bus_id=f"0000:{i + 0x10:02x}:00.0") for i in range(n))
    levels = tuple(tuple("X" if i == j else ("PIX" if i // 2 == j // 2 else "SYS") for j in range(n))
                   for i in range(n))
    return Inventory(gpus=gpus, levels=levels, driver_version="550.54.15")


@dataclass
class SimNode:
    """The node, with pods placed on it through the public interfaces."""

    tmp: Path
    n_cards: int = 4
    version: str = "v2"
    driver: str = "systemd"
    runtime: str = "containerd"
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> pod JSON
    uids: dict[str, str] = field(default_factory=dict)  # pod name -> uid
    count: int = 0

    def __post_init__(self) -> None:
        self.inv = inventory(self.n_cards)
        self.state = NodeState("node-a", self.inv, CheckpointStore(self.tmp / "ckpt"))
        self.sim = SimulatedBackend(self.inv)
        self.cgroup_root = self.tmp / "cgroup"
        self.base = ct.hierarchy(self.cgroup_root, self.version)
        self.metrics = AgentMetrics()
        self.backend: Any = self.sim

    def reader(self, backend: Any = None, pods: Callable[[str], Mapping[str, Any] | None] | None = None) -> UsageReader:
        return UsageReader(self.state, backend or self.backend, pods or self.pods.get, CgroupReader(self.cgroup_root))

    async def place(self, pod: str, container: str, cards: tuple[int, ...], cores: int, memory_mib: int,
                    pids: list[int], qos: str = "burstable", namespace: str = "ml", verified: bool = True,
                    running: bool = True, created: int = 1700000000, mig: str | None = None) -> str:
        """A pod's container holding `cards`, its cgroup holding `pids`. Returns the allocation key."""
        self.count += 1
        uid = self.uids.setdefault(pod, ct.pod_uid(self.count))
        cid = ct.container_id(self.count)
        doc = self.pods.setdefault(uid, {
            "metadata": {"name": pod, "namespace": namespace, "uid": uid},
            "status": {"qosClass": {"guaranteed": "Guaranteed", "burstable": "Burstable",
                                    "besteffort": "BestEffort"}[qos], "containerStatuses": []},
        })
        if running:
            doc["status"]["containerStatuses"].append(
                {"name": container, "containerID": f"{ct.SCHEME[self.runtime]}://{cid}"})
            ct.add_container(self.base, self.driver, self.runtime, qos, uid, cid, pids)
        key = f"{uid}/{container}"
        holder = ContainerHolder(pod_uid=uid, namespace=namespace, pod=pod, container=container)
        alloc = Allocation(key, cards, cores, memory_mib, holder, verified=verified, created=created, mig=mig)
        await self.state.commit(lambda led: led.assign(alloc))
        return key


class RecordingBackend:
    """The simulated backend seen through a wrapper: records which thread asks, repeats samples, fails cards,
    or holds its next call until `gate` is set (5 s at most)."""

    def __init__(self, sim: SimulatedBackend):
        import threading

        self.sim = sim
        self.threads: set[int] = set()
        self.duplicate = False
        self.failing: set[int] = set()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def inventory(self) -> Inventory:
        return self.sim.inventory()

    def status(self, index: int) -> GPUStatus:
        import dataclasses
        import threading

        self.threads.add(threading.get_ident())
        self.entered.set()
        gate, self.gate = self.gate, None  # holds the first call only
        if gate is not None:
            gate.wait(30)  # the test opens it (after a request that a loaded machine may make slow); a bound
        if index in self.failing:
            raise RuntimeError(f"NVML_ERROR_GPU_IS_LOST on GPU{index}")
        s = self.sim.status(index)
        if self.duplicate:
            s = dataclasses.replace(s, processes=s.processes + s.processes)
        return s

    def wait_events(self, timeout_s: float) -> list[Any]:
        return self.sim.wait_events(timeout_s)

    def close(self) -> None:
        self.sim.close()
