"""Data types of device discovery: what a node has, and what happens on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class DiscoveryError(Exception):
    """The node's GPUs could not be discovered (library missing, driver not loaded, no permission, bad spec)."""


@dataclass(frozen=True)
class GPU:
    index: int  # NVML enumeration order, 0..N-1
    uuid: str
    minor: int  # N in /dev/nvidiaN
    name: str
    memory_mib: int
    bus_id: str = ""
    numa_node: int | None = None
    gpm: bool | None = None  # GPM (Hopper and later) as NVML answered; None: not read (see devices/arch.py)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "minor": self.minor,
            "name": self.name,
            "memory_mib": self.memory_mib,
            "bus_id": self.bus_id,
            "numa_node": self.numa_node,
        }
        if self.gpm is not None:
            doc["gpm"] = self.gpm
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GPU:
        numa = doc.get("numa_node")
        return cls(
            index=int(doc["index"]),
            uuid=str(doc["uuid"]),
            minor=int(doc.get("minor", doc["index"])),
            name=str(doc.get("name", "")),
            memory_mib=int(doc["memory_mib"]),
            bus_id=str(doc.get("bus_id", "")),
            numa_node=None if numa is None else int(numa),
            gpm=None if doc.get("gpm") is None else bool(doc["gpm"]),
        )


@dataclass(frozen=True)
class Inventory:
    """Everything static about a node's GPUs. `levels[i][j]` is the canonical link level ("X" on the diagonal)."""

    gpus: tuple[GPU, ...]
    levels: tuple[tuple[str, ...], ...]
    driver_version: str = ""
    cuda_driver_version: str = ""

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if [g.index for g in self.gpus] != list(range(n)):
            raise DiscoveryError("GPU indices must be 0..N-1 in order")
        if len(self.levels) != n or any(len(row) != n for row in self.levels):
            raise DiscoveryError(f"level matrix must be {n}x{n}")

    @property
    def count(self) -> int:
        return len(self.gpus)

    def by_uuid(self, uuid: str) -> GPU | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "levels": [list(r) for r in self.levels],
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Inventory:
        return cls(
            gpus=tuple(GPU.from_json(g) for g in doc["gpus"]),
            levels=tuple(tuple(str(c) for c in row) for row in doc["levels"]),
            driver_version=str(doc.get("driver_version", "")),
            cuda_driver_version=str(doc.get("cuda_driver_version", "")),
        )


@dataclass(frozen=True)
class ProcessUsage:
    """One process on one GPU, as NVML reports it (host PID)."""

    pid: int
    used_memory_bytes: int = 0
    sm_util: int = 0  # percent of the card over the last sampling period


@dataclass(frozen=True)
class GPUStatus:
    """What changes on a card: usage, temperature, errors."""

    index: int
    used_memory_bytes: int = 0
    utilization: int = 0
    temperature_c: int | None = None
    processes: tuple[ProcessUsage, ...] = ()
    lost: bool = False  # fell off the bus
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since driver load; None: not known


@dataclass(frozen=True)
class HealthEvent:
    """A health-relevant event on a card."""

    index: int
    kind: str  # "xid" | "ecc" | "lost" | "recovered"
    code: int = 0  # XID number, or count of uncorrectable ECC errors
    detail: str = ""
    gi: int | None = None  # the MIG GPU instance the event names (None: the whole card)
