"""Devices per extended resource as the plugins last reported them over ListAndWatch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.sim.kubelet.protocol import HEALTHY, UNHEALTHY


class DeviceRegistry:
    """Resource name -> device ID -> `DeviceInfo`.

    A resource can be known with no devices (read from the checkpoint, plugin not yet re-registered):
    the kubelet then reports capacity 0 until the plugin sends its list.
    """

    def __init__(self) -> None:
        self._devices: dict[str, dict[str, DeviceInfo]] = {}

    def resources(self) -> list[str]:
        return sorted(self._devices)

    def is_known(self, resource: str) -> bool:
        return resource in self._devices

    def add_resource(self, resource: str) -> None:
        self._devices.setdefault(resource, {})

    def replace(self, resource: str, devices: Iterable[pb.Device]) -> None:
        """Apply one ListAndWatch message: the complete device list of `resource`."""
        self._devices[resource] = {
            d.ID: DeviceInfo(d.ID, HEALTHY if d.health == HEALTHY else UNHEALTHY, _numa_nodes(d))
            for d in devices
        }

    def mark_unhealthy(self, resource: str) -> None:
        current = self._devices.get(resource, {})
        self._devices[resource] = {
            i: DeviceInfo(i, UNHEALTHY, info.numa_nodes) for i, info in current.items()
        }

    def clear(self) -> None:
        self._devices.clear()

    def health(self, resource: str) -> dict[str, str]:
        return {i: info.health for i, info in self._devices.get(resource, {}).items()}

    def healthy(self, resource: str) -> set[str]:
        return {i for i, info in self._devices.get(resource, {}).items() if info.health == HEALTHY}

    def numa_nodes(self, resource: str, device_id: str) -> tuple[int, ...]:
        info = self._devices.get(resource, {}).get(device_id)
        return info.numa_nodes if info else ()

    def topology(self, resource: str) -> dict[str, tuple[int, ...]]:
        return {i: info.numa_nodes for i, info in self._devices.get(resource, {}).items()}


def _numa_nodes(device: pb.Device) -> tuple[int, ...]:
    if not device.HasField("topology"):
        return ()
    return tuple(node.ID for node in device.topology.nodes)


@dataclass(frozen=True)
class DeviceInfo:
    id: str
    health: str
    numa_nodes: tuple[int, ...]
