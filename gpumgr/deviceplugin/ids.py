"""Device IDs: per card, so that the kubelet's choice of IDs names the card.

`<card UUID>::c<NN>` for vcuda-core (100 per card) and `<card UUID>::m<NNNN>` for vcuda-memory (card memory /
unit per card). UUIDs rather than indices keep IDs stable if the enumeration order changes across reboots, and
the kubelet's checkpoint keeps IDs across restarts. At most 63 characters, as the API asks.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpumgr.devices.types import GPU, Inventory

SEP = "::"


class BadDeviceID(ValueError):
    pass


def core_ids(gpu: GPU) -> list[str]:
    return [f"{gpu.uuid}{SEP}c{n:02d}" for n in range(100)]


def memory_ids(gpu: GPU, unit_mib: int) -> list[str]:
    return [f"{gpu.uuid}{SEP}m{n:04d}" for n in range(gpu.memory_mib // unit_mib)]


def split(device_id: str) -> tuple[str, str]:
    """(card UUID, kind 'c' or 'm') of a device ID."""
    uuid, sep, rest = device_id.rpartition(SEP)
    if not sep or not uuid or not rest or rest[0] not in "cm" or not rest[1:].isdigit():
        raise BadDeviceID(f"not a gpumgr device ID: {device_id!r}")
    return uuid, rest[0]


def cards_of(inv: Inventory, device_ids: Iterable[str], kind: str) -> dict[int, int]:
    """Card index → number of IDs on it. Raises BadDeviceID for unknown, foreign or duplicate IDs."""
    seen: set[str] = set()
    out: dict[int, int] = {}
    for d in device_ids:
        if d in seen:
            raise BadDeviceID(f"device ID listed twice: {d!r}")
        seen.add(d)
        uuid, k = split(d)
        if k != kind:
            raise BadDeviceID(f"{d!r} is not a {'vcuda-core' if kind == 'c' else 'vcuda-memory'} device ID")
        gpu = inv.by_uuid(uuid)
        if gpu is None:
            raise BadDeviceID(f"{d!r} names a card this node does not have")
        out[gpu.index] = out.get(gpu.index, 0) + 1
    return out
