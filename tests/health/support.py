"""What the health tests share: a small node, a backend that can also send what only NVML sends, a clock the
test moves by hand, and a bounded wait."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.types import GPU, GPUStatus, HealthEvent, Inventory
from gpumgr.health.monitor import HealthConfig, HealthMonitor
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState

CARDS = 4


def inventory(count: int = CARDS) -> Inventory:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:04d}", minor=i, name="NVIDIA A100-SXM4-40GB", memory_mib=40960)
                 for i in range(count))
    levels = tuple(tuple("X" if i == j else "NV12" for j in range(count)) for i in range(count))
    return Inventory(gpus=gpus, levels=levels, driver_version="550.54.15", cuda_driver_version="12.4")


def node_state(tmp_path: Path, count: int = CARDS) -> NodeState:
    return NodeState("node-a", inventory(count), CheckpointStore(tmp_path))


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedBackend:
    """A SimulatedBackend plus what the simulator cannot produce but NVML can: an event for an unknown card
    (index -1), a card that reads as lost without an event, a card whose status cannot be read."""

    def __init__(self, sim: SimulatedBackend):
        self.sim = sim
        self.lost: set[int] = set()
        self.unreadable: set[int] = set()
        self._extra: queue.SimpleQueue[HealthEvent] = queue.SimpleQueue()

    def push(self, event: HealthEvent) -> None:
        self._extra.put(event)

    def inventory(self) -> Inventory:
        return self.sim.inventory()

    def status(self, index: int) -> GPUStatus:
        if index in self.unreadable:
            raise RuntimeError(f"NVML: Unknown Error reading card {index}")
        if index in self.lost:
            return GPUStatus(index=index, lost=True)
        return self.sim.status(index)

    def wait_events(self, timeout_s: float) -> list[HealthEvent]:
        out = []
        while not self._extra.empty():
            out.append(self._extra.get())
        return out + self.sim.wait_events(0 if out else min(timeout_s, 0.05))

    def close(self) -> None:
        self.sim.close()


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait (bounded) until `condition()` holds; fail naming `what` otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Rig:
    """A HealthMonitor on a real NodeState, its callbacks recorded."""

    sim: SimulatedBackend
    backend: ScriptedBackend
    state: NodeState
    clock: ManualClock
    monitor: HealthMonitor
    transitions: list[tuple[int, bool, str]] = field(default_factory=list)
    xids: list[tuple[int, int]] = field(default_factory=list)

    def healthy(self) -> list[bool]:
        return [c.healthy for c in self.state.ledger.cards]

    def reasons(self, index: int) -> set[str]:
        return set(self.state.health_reasons[index])


def build_rig(tmp_path: Path, config: HealthConfig, count: int = CARDS) -> Rig:
    sim = SimulatedBackend(inventory(count))
    backend = ScriptedBackend(sim)
    state = node_state(tmp_path, count)
    clock = ManualClock()
    transitions: list[tuple[int, bool, str]] = []
    xids: list[tuple[int, int]] = []
    monitor = HealthMonitor(backend, state, config, on_transition=lambda i, h, r: transitions.append((i, h, r)),
                            on_xid=lambda i, x: xids.append((i, x)), clock=clock)
    return Rig(sim, backend, state, clock, monitor, transitions, xids)
