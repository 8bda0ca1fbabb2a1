"""Partitionable MIG devices for DRA (`sharedCounters` / `consumesCounters`, resource.k8s.io/v1): pure, the
MIG-capable cards in, ResourceSlice specs out.

Each card in MIG mode gets one counter set `gpu-<index>-counter-set`: `memory-slice-<k>` (1 each), `multiprocessors`
and `memory` (bytes). Each (profile, placement) is a device `gpu-<index>-mig-<profile>-<profile id>-<start>` that
consumes its memory slices, its multiprocessors and its memory, so the scheduler itself never hands out two
overlapping instances. Each device is multi-allocatable with consumable `cores` (100) and `memory` (the instance's
bytes) under a requestPolicy like the whole-card devices' (gpumgr/dra/slices.py): a claim asking no capacity takes
the defaults, i.e. the whole instance; a claim asking `capacity.requests` takes a share of it. kube-scheduler
consumes a multi-allocated device's counters once, with its first allocation, so shares of one instance never
count its memory slices twice. A card in MIG mode is offered only as MIG devices (its whole-card device is left out:
nothing can run on the parent of a MIG-enabled card); a card with MIG off keeps its whole/fractional device.
Since Kubernetes 1.35 a slice holds counters or devices, never both: counters go in their own slices (at most 8
sets each), devices in slices of at most 128.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.devices.types import Inventory
from gpumgr.dra.slices import CORES, memory_ceiling
from gpumgr.mig.types import MigCard, MigProfile
from gpumgr.requests.claim_results import mig_device
from gpumgr.requests.quantity import format_bytes

MIB = 2**20
MAX_DEVICES = 128
MAX_COUNTER_SETS = 8
DEFAULT_UNIT_MIB = 256  # DraConfig.memory_unit_mib's default


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-counter-set"


def device_name(index: int, profile: MigProfile, start: int) -> str:
    return f"gpu-{index}-mig-{re.sub(r'[^a-z0-9]+', '-', profile.name.lower()).strip('-')}-{profile.id}-{start}"


def parse_device_name(name: str) -> tuple[int, int, int] | None:
    """(card, profile id, start) of a MIG device name, or None for any other device."""
    return mig_device(name)


def counter_set(card: MigCard) -> dict[str, Any]:
    full = max(card.profiles, key=lambda p: (p.slices, p.memory_mib))
    counters = {f"memory-slice-{k}": {"value": "1"} for k in range(card.memory_slices)}
    counters["multiprocessors"] = {"value": str(full.multiprocessors)}
    counters["memory"] = {"value": format_bytes(full.memory_mib * MIB)}
    return {"name": counter_set_name(card.index), "counters": counters}


def capacity(memory_mib: int, unit_mib: int) -> dict[str, Any]:
    """`memory` (the instance's bytes; requests in steps of `unit_mib`, by default all of it rounded down to a step)
    and `cores` (100; by default all): what one share of the instance consumes."""
    unit = min(unit_mib, memory_mib)
    top = format_bytes(memory_ceiling(memory_mib, unit))
    step = format_bytes(unit * MIB)
    return {"memory": {"value": format_bytes(memory_mib * MIB), "requestPolicy": {
                "default": top, "validRange": {"min": step, "max": top, "step": step}}},
            "cores": {"value": str(CORES), "requestPolicy": {
                "default": str(CORES), "validRange": {"min": "1", "max": str(CORES), "step": "1"}}}}


def devices(card: MigCard, inv: Inventory, unhealthy: str | None = None,
            unit_mib: int = DEFAULT_UNIT_MIB) -> list[dict[str, Any]]:
    parent = inv.gpus[card.index]
    out = []
    for p in card.profiles:
        if "+me" in p.name:
            continue  # media-extension profiles differ only in engines: left out, as NVIDIA's driver does
        for start in p.starts:
            consumed = {f"memory-slice-{k}": {"value": "1"} for k in range(start, start + p.memory_slices)}
            consumed["multiprocessors"] = {"value": str(p.multiprocessors)}
            consumed["memory"] = {"value": format_bytes(p.memory_mib * MIB)}
            dev: dict[str, Any] = {
                "name": device_name(card.index, p, start),
                "attributes": {
                    "type": {"string": "mig"},
                    "profile": {"string": p.name},
                    "parentUUID": {"string": parent.uuid},
                    "index": {"int": card.index},
                    "minor": {"int": parent.minor},
                    "model": {"string": parent.name or "unknown"},
                    "memorySliceStart": {"int": start},
                    "multiprocessors": {"int": p.multiprocessors},
                },
                "capacity": capacity(p.memory_mib, unit_mib),
                "allowMultipleAllocations": True,
                "consumesCounters": [{"counterSet": counter_set_name(card.index), "counters": consumed}],
            }
            if unhealthy is not None:
                dev["taints"] = [{"key": "gpumgr.io/unhealthy", "value": unhealthy[:63] or "unhealthy",
                                  "effect": "NoSchedule"}]
            out.append(dev)
    return out


def build_slices(base_spec: Mapping[str, Any], cards: Iterable[MigCard], inv: Inventory,
                 unhealthy: Mapping[int, str] | None = None,
                 unit_mib: int = DEFAULT_UNIT_MIB) -> list[dict[str, Any]]:
    """The pool as ResourceSlice specs: `base_spec` (slices.build_spec's one slice) without the whole-card devices
    of cards in MIG mode, their MIG devices added; counter slices first. Every spec names the pool's slice count."""
    return assemble(base_spec, mig_part(cards, inv, unhealthy, unit_mib))


def mig_part(cards: Iterable[MigCard], inv: Inventory, unhealthy: Mapping[int, str] | None = None,
             unit_mib: int = DEFAULT_UNIT_MIB) -> MigPart:
    """The MIG cards' counter sets and devices: what `assemble` adds to any base spec (a caller may keep it while
    the cards, their free placements and their health stay the same; the dicts in it are never changed)."""
    mig = [c for c in cards if c.enabled]
    return MigPart(names=frozenset(f"gpu-{c.index}" for c in mig),
                   devices=tuple(d for c in mig for d in devices(c, inv, (unhealthy or {}).get(c.index), unit_mib)),
                   sets=tuple(counter_set(c) for c in mig))


def assemble(base_spec: Mapping[str, Any], part: MigPart) -> list[dict[str, Any]]:
    base_devices = [d for d in base_spec.get("devices", []) if d.get("name") not in part.names]
    all_devices = base_devices + list(part.devices)
    specs: list[dict[str, Any]] = []
    for i in range(0, len(part.sets), MAX_COUNTER_SETS):
        specs.append({"sharedCounters": list(part.sets[i:i + MAX_COUNTER_SETS])})
    for i in range(0, max(len(all_devices), 1), MAX_DEVICES):
        specs.append({"devices": all_devices[i:i + MAX_DEVICES]})
    pool = dict(base_spec.get("pool") or {})
    pool["resourceSliceCount"] = len(specs)
    return [{"driver": base_spec["driver"], "nodeName": base_spec["nodeName"], "pool": pool, **s} for s in specs]


@dataclass(frozen=True)
class MigPart:
    names: frozenset[str]  # the whole-card devices the MIG devices replace (gpu-<index>)
    devices: tuple[dict[str, Any], ...]
    sets: tuple[dict[str, Any], ...]
