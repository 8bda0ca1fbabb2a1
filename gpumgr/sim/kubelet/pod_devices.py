"""Which devices each pod's containers hold, per resource, with the plugin's Allocate answer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpumgr.pb.deviceplugin_pb2 import ContainerAllocateResponse


class PodDevices:
    """The kubelet's podDevices: one `ContainerDevices` per (pod, container, resource), insertion-ordered."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str, str], ContainerDevices] = {}

    def insert(self, entry: ContainerDevices) -> None:
        self._entries[(entry.pod_uid, entry.container_name, entry.resource_name)] = entry

    def get(self, pod_uid: str, container_name: str, resource: str) -> ContainerDevices | None:
        return self._entries.get((pod_uid, container_name, resource))

    def remove(self, pod_uid: str, container_name: str, resource: str) -> None:
        self._entries.pop((pod_uid, container_name, resource), None)

    def remove_pod(self, pod_uid: str) -> bool:
        keys = [k for k in self._entries if k[0] == pod_uid]
        for key in keys:
            del self._entries[key]
        return bool(keys)

    def replace_all(self, entries: Iterable[ContainerDevices]) -> None:
        self._entries.clear()
        for entry in entries:
            self.insert(entry)

    def entries(self) -> list[ContainerDevices]:
        return list(self._entries.values())

    def has_pod(self, pod_uid: str) -> bool:
        return any(k[0] == pod_uid for k in self._entries)

    def pods(self) -> list[str]:
        return list(dict.fromkeys(k[0] for k in self._entries))

    def in_use(self, resource: str) -> set[str]:
        return {i for e in self._entries.values() if e.resource_name == resource for i in e.device_ids}

    def held_by_pod(self, pod_uid: str, resource: str) -> set[str]:
        return {
            i
            for e in self._entries.values()
            if e.pod_uid == pod_uid and e.resource_name == resource
            for i in e.device_ids
        }

    def pod_view(self, pod_uid: str) -> dict[str, dict[str, tuple[str, ...]]]:
        view: dict[str, dict[str, tuple[str, ...]]] = {}
        for e in self._entries.values():
            if e.pod_uid == pod_uid:
                view.setdefault(e.container_name, {})[e.resource_name] = e.device_ids
        return view


@dataclass(frozen=True)
class ContainerDevices:
    """Devices of one resource held by one container; `numa` groups them by NUMA key as checkpointed."""

    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: tuple[str, ...]
    numa: tuple[tuple[str, tuple[str, ...]], ...]
    alloc_resp: ContainerAllocateResponse | None
    # reserved while its Allocate call is in flight: counted as in use, never checkpointed (the kubelet records a
    # container's devices in its checkpoint only once the plugin answered)
    in_flight: bool = False
