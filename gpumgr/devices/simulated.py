"""The simulated backend: a node spec stands in for NVML, and tests inject what happens on the cards."""

from __future__ import annotations

import threading
from pathlib import Path

from gpumgr.devices.mig_sim import SimulatedMig
from gpumgr.devices.spec import load_node_spec
from gpumgr.devices.types import GPUStatus, HealthEvent, Inventory, ProcessUsage
from gpumgr.mig.types import MigCard, MigInstance


class SimulatedBackend:
    def __init__(self, inventory: Inventory, mig: SimulatedMig | None = None):
        self._inv = inventory
        self.mig = mig if mig is not None else SimulatedMig(inventory, {})
        self._cond = threading.Condition()
        self._events: list[HealthEvent] = []
        self._temps: dict[int, int] = {g.index: 40 for g in inventory.gpus}
        self._lost: set[int] = set()
        self._procs: dict[int, dict[int, ProcessUsage]] = {g.index: {} for g in inventory.gpus}

    @classmethod
    def from_spec(cls, path: str | Path) -> SimulatedBackend:
        return cls(load_node_spec(path))

    # -- Backend --------------------------------------------------------------------------------------------
    def inventory(self) -> Inventory:
        return self._inv

    def status(self, index: int) -> GPUStatus:
        with self._cond:
            procs = tuple(self._procs[index].values())
            return GPUStatus(
                index=index,
                used_memory_bytes=sum(p.used_memory_bytes for p in procs),
                utilization=min(100, sum(p.sm_util for p in procs)),
                temperature_c=self._temps[index],
                processes=procs,
                lost=index in self._lost,
            )

    def wait_events(self, timeout_s: float) -> list[HealthEvent]:
        with self._cond:
            if not self._events:
                self._cond.wait(timeout_s)
            out, self._events = self._events, []
            return out

    def close(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- MIG (the instances live in `self.mig`: hand the same one to a restarted agent) -------------------
    def mig_cards(self) -> tuple[MigCard, ...]:
        return self.mig.cards()

    def mig_create(self, index: int, profile_id: int, start: int) -> MigInstance:
        return self.mig.create(index, profile_id, start)

    def mig_destroy(self, index: int, gi: int) -> bool:
        return self.mig.destroy(index, gi)

    def mig_set_mode(self, index: int, enabled: bool) -> str:
        return self.mig.set_mode(index, enabled)

    # -- injection (tests, demo) ----------------------------------------------------------------------------
    def inject_xid(self, index: int, xid: int) -> None:
        self._push(HealthEvent(index=index, kind="xid", code=xid))

    def inject_ecc(self, index: int, count: int = 1) -> None:
        self._push(HealthEvent(index=index, kind="ecc", code=count))

    def fall_off_bus(self, index: int) -> None:
        with self._cond:
            self._lost.add(index)
        self._push(HealthEvent(index=index, kind="lost", detail="GPU has fallen off the bus"))

    def recover(self, index: int) -> None:
        """The cause cleared (card reset, back on the bus)."""
        with self._cond:
            self._lost.discard(index)
        self._push(HealthEvent(index=index, kind="recovered"))

    def set_temperature(self, index: int, celsius: int) -> None:
        with self._cond:
            self._temps[index] = celsius

    def set_process(self, index: int, pid: int, used_memory_bytes: int = 0, sm_util: int = 0) -> None:
        with self._cond:
            self._procs[index][pid] = ProcessUsage(pid=pid, used_memory_bytes=used_memory_bytes, sm_util=sm_util)

    def clear_process(self, index: int, pid: int) -> None:
        with self._cond:
            self._procs[index].pop(pid, None)

    def _push(self, event: HealthEvent) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()
