"""What the vDevice server of an allocation enforces, from the allocation and its cards."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpumgr.allocator import HUNDRED, Allocation
from gpumgr.devices.arch import compute_enforcement
from gpumgr.devices.types import Inventory
from gpumgr.node import binding
from gpumgr.vdevice.limits import DeviceLimit, Limits


def bus_ids(inventory: Inventory, cards: Iterable[int]) -> frozenset[str]:
    """The PCI bus IDs of these cards (a vDevice server refuses a Register naming others)."""
    return frozenset(bus for c in cards if (bus := inventory.gpus[c].bus_id))


def container_limits(inventory: Inventory, memory_unit_mib: int, alloc: Allocation,
                     pod: Mapping[str, Any]) -> Limits:
    """A container's own limits, from what it asks (its allocation may reserve more for a reusing container)."""
    return with_compute(inventory, _limits(inventory, memory_unit_mib, alloc, pod), mig=alloc.mig is not None)


def with_compute(inventory: Inventory, limits: Limits, mig: bool) -> Limits:
    """Say per device how its compute limit is enforced. Inside a MIG instance (`mig`: the allocation lives in one;
    or a device named by its MIG UUID) NVML has no per-process utilisation: `gpm` when the card (`index`) has GPM,
    else `none`; a card or a share of one is `process`."""
    devices = tuple(
        replace(d, compute=compute_enforcement(inventory.gpus[d.index], mig or d.uuid.startswith("MIG-")))
        if 0 <= d.index < inventory.count else d
        for d in limits.devices)
    return replace(limits, devices=devices)


def _limits(inventory: Inventory, memory_unit_mib: int, alloc: Allocation, pod: Mapping[str, Any]) -> Limits:
    gpus = [inventory.gpus[c] for c in alloc.cards]
    ask = binding.find_container(pod, alloc.container)
    if ask is not None and ask.cores == alloc.cores and alloc.cores < HUNDRED:
        alloc = replace(alloc, memory_mib=ask.memory_units * memory_unit_mib)
    if alloc.cores >= HUNDRED:
        return Limits(pod_uid=alloc.pod_uid, container_name=alloc.container, core_limit=0, hard_limit=True,
                      core_ceiling=0, devices=tuple(DeviceLimit(g.uuid, g.index, 0) for g in gpus))
    ceiling = binding.core_ceiling(pod)
    if ceiling is not None:
        ceiling = max(ceiling, alloc.cores)  # a ceiling below the share would be a harder limit than asked
    return Limits(
        pod_uid=alloc.pod_uid, container_name=alloc.container, core_limit=alloc.cores,
        hard_limit=ceiling is None, core_ceiling=ceiling or 0,
        devices=tuple(DeviceLimit(g.uuid, g.index, alloc.memory_mib << 20) for g in gpus),
    )


class LimitsMemo:
    """`container_limits` of the (allocation, pod) pairs asked before. The pod cache replaces a pod object whole on
    every change and a record is replaced on every change of the ledger, so the same two objects give the same
    limits; reconcile asks for every verified container at every pass."""

    def __init__(self, inventory: Inventory, memory_unit_mib: int):
        self.inventory = inventory
        self.memory_unit_mib = memory_unit_mib
        self._seen: dict[str, tuple[Allocation, Mapping[str, Any], Limits]] = {}

    def get(self, alloc: Allocation, pod: Mapping[str, Any]) -> Limits:
        hit = self._seen.get(alloc.key)
        if hit is not None and hit[0] is alloc and hit[1] is pod:
            return hit[2]
        limits = container_limits(self.inventory, self.memory_unit_mib, alloc, pod)
        self._seen[alloc.key] = (alloc, pod, limits)
        return limits

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget the pairs of allocations no longer held."""
        keep = set(keys)
        for k in [k for k in self._seen if k not in keep]:
            del self._seen[k]
