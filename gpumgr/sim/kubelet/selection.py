"""How the kubelet picks device IDs for one (container, resource): reuse first, then the plugin's
preference, then whatever is free. Pure functions; where the kubelet iterates a Go set (random order),
these use sorted order so the emulator is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class NotEnoughDevices(Exception):
    """Fewer healthy free devices than requested."""


def take_reusable(required: int, reusable: Iterable[str]) -> list[str]:
    """Devices reused from init containers of the same pod, up to `required`."""
    return sorted(reusable)[:required]


def complete_selection(
    resource: str, required: int, chosen: Sequence[str], available: set[str], preferred: Sequence[str]
) -> list[str]:
    """Fill `chosen` up to `required`: first the plugin's preferred IDs that are actually available
    (in the plugin's order), then the sorted remainder of `available`.
    """
    result = list(chosen)
    pool = available - set(result)
    if required - len(result) > len(pool):
        raise NotEnoughDevices(
            f"requested number of devices unavailable for {resource}: "
            f"requested {required - len(result)}, available {len(pool)}"
        )
    for source in (preferred, sorted(available)):
        for device_id in source:
            if len(result) == required:
                return result
            if device_id in available and device_id not in result:
                result.append(device_id)
    return result
