"""The node's ResourceSlice: one device per GPU with attributes, consumable capacity and health taints.

Pure: inventory + health in, the slice's `spec` (API JSON) out. The publisher owns names, generations and I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpumgr.devices.types import GPU, Inventory
from gpumgr.dra.config import UNHEALTHY_TAINT
from gpumgr.requests.quantity import format_bytes

MIB = 2**20
CORES = 100
PCIE_SHARED_ROOT = frozenset({"PIX", "PXB", "PHB"})  # paths that stay under one PCIe host bridge
MAX_REASON = 63  # a taint value is a label value
_SEMVER_PART = re.compile(r"\d+")


def device_name(index: int) -> str:
    return f"gpu-{index}"


def build_spec(inventory: Inventory, node_name: str, driver: str, unhealthy: Mapping[int, str],
               memory_unit_mib: int, generation: int,
               held_elsewhere: Mapping[int, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The ResourceSlice spec for the whole pool (one slice: a node has far fewer than 128 GPUs).

    `held_elsewhere`: card -> (cores, MiB) that holders other than DRA claims (device-plugin pods, in `both`
    mode) take; the capacity shown is what is left, so the scheduler never hands that part to a claim. Every
    range passes the API server's checks: max and default are the value rounded down to the step, and a card
    with less than min + step left (held whole elsewhere) is left out of the slice."""
    nvlink = nvlink_domains(inventory)
    roots = pcie_roots(inventory)
    held = held_elsewhere or {}
    built = (_device(g, inventory, nvlink[g.index], roots[g.index], unhealthy.get(g.index), memory_unit_mib,
                     held.get(g.index, (0, 0)))
             for g in inventory.gpus)
    devices = [d for d in built if d is not None]
    return {
        "driver": driver,
        "nodeName": node_name,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
        "devices": devices,
    }


def _floor_to_step(value: int, low: int, step: int) -> int:
    """The largest `low + n*step` that is <= value (the API requires max - min to be a multiple of step)."""
    return low + (value - low) // step * step


def memory_ceiling(card_mib: int, unit_mib: int) -> int:
    """Bytes: the most memory one claim can be granted on an unshared card (its memory rounded down to the
    request step). A grant of this much is the whole card: the shim needs no memory limit for it."""
    unit = min(unit_mib, card_mib)
    return _floor_to_step(card_mib, unit, unit) * MIB


def _device(g: GPU, inv: Inventory, nvlink: str, root: str, reason: str | None,
            unit_mib: int, held: tuple[int, int]) -> dict[str, Any] | None:
    attrs: dict[str, dict[str, Any]] = {
        "uuid": {"string": g.uuid},
        "model": {"string": g.name or "unknown"},
        "index": {"int": g.index},
        "minor": {"int": g.minor},
        "nvlinkDomain": {"string": nvlink},
        "resource.kubernetes.io/pcieRoot": {"string": root},
    }
    if g.bus_id:
        attrs["pciBusID"] = {"string": g.bus_id}
    if g.numa_node is not None:
        attrs["numaNode"] = {"int": g.numa_node}
    for key, text in (("driverVersion", inv.driver_version), ("cudaVersion", inv.cuda_driver_version)):
        version = semver(text)
        if version:
            attrs[key] = {"version": version}
    memory_mib = max(0, g.memory_mib - held[1])
    cores = max(0, CORES - held[0])
    unit_mib = min(unit_mib, g.memory_mib)
    if memory_mib < 2 * unit_mib or cores < 2:
        return None  # what is left cannot form a valid range (min + step <= value): offer nothing of the card
    memory_max = _floor_to_step(memory_mib, unit_mib, unit_mib) * MIB
    unit = format_bytes(unit_mib * MIB)
    device: dict[str, Any] = {
        "name": device_name(g.index),
        "attributes": attrs,
        "capacity": {
            "memory": {"value": format_bytes(memory_mib * MIB), "requestPolicy": {
                "default": format_bytes(memory_max),
                "validRange": {"min": unit, "max": format_bytes(memory_max), "step": unit}}},
            "cores": {"value": str(cores), "requestPolicy": {
                "default": str(cores), "validRange": {"min": "1", "max": str(cores), "step": "1"}}},
        },
        "allowMultipleAllocations": True,
    }
    if reason is not None:
        device["taints"] = [{"key": UNHEALTHY_TAINT, "value": taint_value(reason), "effect": "NoSchedule"}]
    return device


def taint_value(reason: str) -> str:
    """A reason as a label value: letters, digits, `-_.`, at most 63, starting and ending alphanumeric."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:MAX_REASON].strip("-_.")
    return text or "unhealthy"


def semver(text: str) -> str:
    """`550.54.15` stays, `12.4` -> `12.4.0`; '' when there is no version."""
    parts = [str(int(p)) for p in _SEMVER_PART.findall(text)[:3]]
    if not parts:
        return ""
    return ".".join(parts + ["0"] * (3 - len(parts)))


def nvlink_domains(inv: Inventory) -> dict[int, str]:
    """Cards joined by NVLink (directly or through others) share a domain; a card without NVLink has its own."""
    groups = _components(inv, lambda level: level.startswith("NV"))
    out: dict[int, str] = {}
    for members in groups:
        digest = hashlib.sha256("\n".join(sorted(inv.gpus[i].uuid for i in members)).encode()).hexdigest()
        for i in members:
            out[i] = f"nvl-{digest[:16]}"
    return out


def pcie_roots(inv: Inventory) -> dict[int, str]:
    """Cards whose path stays under one host bridge (PIX, PXB, PHB) share a root: `pci<domain>:<nn>`."""
    groups = _components(inv, lambda level: level in PCIE_SHARED_ROOT)
    out: dict[int, str] = {}
    for n, members in enumerate(groups):
        domain = "0000"
        first = inv.gpus[min(members)].bus_id
        if first.count(":") >= 2:
            domain = first.split(":")[0][-4:].lower().zfill(4)
        for i in members:
            out[i] = f"pci{domain}:{n:02x}"
    return out


def _components(inv: Inventory, joined: Any) -> list[list[int]]:
    n = inv.count
    seen: set[int] = set()
    groups: list[list[int]] = []
    for start in range(n):
        if start in seen:
            continue
        stack, members = [start], []
        seen.add(start)
        while stack:
            i = stack.pop()
            members.append(i)
            for j in range(n):
                if j not in seen and j != i and joined(inv.levels[i][j]):
                    seen.add(j)
                    stack.append(j)
        groups.append(sorted(members))
    return groups


def unhealthy_map(reasons: Mapping[int, Iterable[str]]) -> dict[int, str]:
    """Card index -> one reason (sorted first), for the cards that have any."""
    return {i: sorted(r)[0] for i, r in reasons.items() if r}
