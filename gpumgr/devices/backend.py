"""The interface every device backend offers (real NVML, simulated)."""

from __future__ import annotations

from typing import Protocol

from gpumgr.devices.types import GPUStatus, HealthEvent, Inventory
from gpumgr.mig.types import MigCard, MigInstance


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


class MigBackend(Protocol):
    """MIG on the node's cards (both backends offer it; cards that are not MIG-capable are simply absent).
    Every call blocks (NVML): run it off the event loop. Failures raise MigError with a message for the user."""

    def mig_cards(self) -> tuple[MigCard, ...]:
        """Each MIG-capable card: mode, profiles and placements, and the instances that exist now."""
        ...

    def mig_create(self, index: int, profile_id: int, start: int) -> MigInstance:
        """A GPU instance of `profile_id` at memory slice `start`, with one full-size compute instance."""
        ...

    def mig_destroy(self, index: int, gi: int) -> bool:
        """Destroy GPU instance `gi` (and its compute instances); False when it did not exist."""
        ...

    def mig_set_mode(self, index: int, enabled: bool) -> str:
        """"done", or "reset required" (Ampere)."""
        ...
