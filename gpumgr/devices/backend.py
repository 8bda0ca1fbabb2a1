"""The interface every device backend offers (real NVML, simulated)."""

from __future__ import annotations

from typing import Protocol

from gpumgr.devices.types import GPUStatus, HealthEvent, Inventory


class Backend(Protocol):
    def inventory(self) -> Inventory:
        """GPUs, pairwise link levels, driver version. Raises DiscoveryError when the node cannot be read."""
        ...

    def status(self, index: int) -> GPUStatus:
        """Usage, temperature and processes of one card right now (blocking; call off the event loop)."""
        ...

    def wait_events(self, timeout_s: float) -> list[HealthEvent]:
        """Health events since the last call, waiting up to `timeout_s` for one (blocking)."""
        ...

    def close(self) -> None: ...
