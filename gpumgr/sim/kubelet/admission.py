"""Pod admission as the kubelet's device manager does it.

Containers are handled in order, init containers first. For each device-plugin resource a container
requests, in sorted resource-name order (the kubelet iterates a Go map, so its order is not fixed; sorted
order puts `vcuda-core` before `vcuda-memory`): devices reusable from the pod's init containers are taken
first; if more are needed and the plugin advertises `get_preferred_allocation_available`, the plugin is
asked (available = the free healthy set plus what was already taken, must-include = what was taken,
size = the whole request); its answer is used where it names available devices and the rest comes from
the sorted free set; then one Allocate call with one ContainerAllocateRequest. After each container the
checkpoint is written (as the kubelet does at the end of a container's allocation), then
PreStartContainer is called for every resource of the container whose plugin set `pre_start_required`.

Any failure rejects the pod: the devices this admission took are freed, the checkpoint is rewritten and
`AdmissionError` is raised. Before any plugin call, a pod needing more devices than are free and healthy
is rejected with reason `OutOf<resource>` (the kubelet's resource-fit predicate).

Re-admitting a pod whose containers already hold devices is what a node reboot does: no new Allocate for
those, a check that the plugin is registered and the devices are still healthy, and PreStartContainer again.

Deviations from the kubelet: an extended resource no plugin ever registered is rejected (the kubelet would
silently drop it from the pod); names without a domain (cpu, memory, ...) are ignored; every init container
is treated as non-restartable (no sidecars).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import grpc

from gpumgr.pb.deviceplugin_pb2 import ContainerAllocateResponse
from gpumgr.sim.kubelet.endpoint import EndpointError, PluginEndpoint
from gpumgr.sim.kubelet.manager import DeviceManager
from gpumgr.sim.kubelet.pod_devices import ContainerDevices
from gpumgr.sim.kubelet.protocol import ADMISSION_ERROR_REASON, is_extended_resource_name
from gpumgr.sim.kubelet.selection import NotEnoughDevices, complete_selection, take_reusable

log = logging.getLogger(__name__)


ResourceOrder = Literal["sorted", "reverse"]


class AdmissionError(Exception):
    """The pod was rejected. `reason` is the kubelet's (`UnexpectedAdmissionError`, `OutOf<resource>`);
    `code` and `details` carry the plugin's gRPC status when a call failed."""

    def __init__(
        self, reason: str, message: str, code: grpc.StatusCode | None = None, details: str = ""
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.code = code
        self.details = details


class _Rejected(Exception):
    pass


async def admit_pod(
    manager: DeviceManager,
    pod_uid: str,
    containers: Sequence[ContainerRequest],
    init_containers: Sequence[ContainerRequest] = (),
    resource_order: ResourceOrder = "sorted",
    start: bool = True,
) -> AdmittedPod:
    """Admit one pod; the caller serializes admissions. `resource_order` is the order of a container's
    resources ("sorted": vcuda-core before vcuda-memory; "reverse": memory first), which the kubelet leaves
    to Go's map iteration. `start=False` stops after the Allocate calls and the checkpoint, as the kubelet's
    admission does: PreStartContainer comes when the containers start (`start_pod`), maybe after other pods
    were admitted."""
    _validate(pod_uid, containers, init_containers)
    if resource_order not in get_args(ResourceOrder):
        raise ValueError(f"resource_order must be 'sorted' or 'reverse', not {resource_order!r}")
    ordered = [(c, True) for c in init_containers] + [(c, False) for c in containers]
    _check_known_resources(manager, ordered)
    _check_fit(manager, pod_uid, init_containers, containers)
    created: list[tuple[str, str, str]] = []
    results: list[ContainerAllocation] = []
    reusable: dict[str, set[str]] = {}
    try:
        for container, is_init in ordered:
            result = await _admit_container(
                manager, pod_uid, container, is_init, reusable, created, resource_order == "reverse"
            )
            if start:
                await _pre_start(manager, result)
            results.append(result)
    except (_Rejected, EndpointError, NotEnoughDevices, OSError) as exc:
        for key in created:
            manager.pods.remove(*key)
        if created:
            try:
                await manager.write_checkpoint()
            except OSError as write_exc:
                log.error("pod %s: rewriting the checkpoint after rejection failed: %s", pod_uid, write_exc)
        manager.signal.notify()
        code = exc.code if isinstance(exc, EndpointError) else None
        details = exc.details if isinstance(exc, EndpointError) else ""
        log.info("pod %s rejected: %s", pod_uid, exc)
        raise AdmissionError(ADMISSION_ERROR_REASON, str(exc), code, details) from exc
    manager.signal.notify()
    log.info("pod %s admitted: %s", pod_uid, {c.name: dict(c.device_ids) for c in results})
    return AdmittedPod(pod_uid, tuple(results))


async def _admit_container(
    manager: DeviceManager,
    pod_uid: str,
    container: ContainerRequest,
    is_init: bool,
    reusable: dict[str, set[str]],
    created: list[tuple[str, str, str]],
    reverse: bool = False,
) -> ContainerAllocation:
    ids_by_resource: dict[str, tuple[str, ...]] = {}
    responses: dict[str, ContainerAllocateResponse] = {}
    wrote = False
    requests = _device_requests(container)
    for resource, count in reversed(requests) if reverse else requests:
        endpoint = _registered_endpoint(manager, resource)
        existing = manager.pods.get(pod_uid, container.name, resource)
        if existing is not None:
            _check_existing(manager, existing, count)
            ids = existing.device_ids
            response = existing.alloc_resp if existing.alloc_resp is not None else ContainerAllocateResponse()
        else:
            ids = tuple(await _choose(manager, endpoint, resource, count, reusable.get(resource, set())))
            entry = ContainerDevices(
                pod_uid, container.name, resource, ids, manager.numa_groups(resource, ids), None, in_flight=True
            )
            manager.pods.insert(entry)  # reserved before the call, as the kubelet marks them in use
            created.append((pod_uid, container.name, resource))
            response = await endpoint.allocate(ids)
            manager.pods.insert(replace(entry, alloc_resp=response, in_flight=False))
            wrote = True
        if is_init:
            reusable.setdefault(resource, set()).update(ids)
        else:
            reusable.setdefault(resource, set()).difference_update(ids)
        ids_by_resource[resource] = ids
        responses[resource] = response
    if wrote:
        await manager.write_checkpoint()
    return ContainerAllocation(container.name, is_init, ids_by_resource, responses)


async def _pre_start(manager: DeviceManager, container: ContainerAllocation) -> None:
    for resource, ids in container.device_ids.items():
        endpoint = _registered_endpoint(manager, resource)
        if endpoint.options.pre_start_required:
            await endpoint.pre_start_container(ids)


async def start_pod(manager: DeviceManager, pod: AdmittedPod) -> None:
    """Start an admitted pod's containers in order: PreStartContainer for each. Raises AdmissionError with the
    plugin's status when a call fails (the kubelet would retry the container with back-off; the caller decides)."""
    try:
        for container in pod.containers:
            await _pre_start(manager, container)
    except (_Rejected, EndpointError) as exc:
        code = exc.code if isinstance(exc, EndpointError) else None
        details = exc.details if isinstance(exc, EndpointError) else ""
        raise AdmissionError("PreStartContainerError", str(exc), code, details) from exc


async def _choose(
    manager: DeviceManager, endpoint: PluginEndpoint, resource: str, count: int, reusable: set[str]
) -> list[str]:
    chosen = take_reusable(count, reusable)
    if len(chosen) == count:
        return chosen
    available = manager.devices.healthy(resource) - manager.pods.in_use(resource)
    preferred: list[str] = []
    if endpoint.options.get_preferred_allocation_available and manager.use_preferred:
        preferred = await endpoint.get_preferred_allocation(sorted(available | set(chosen)), chosen, count)
    return complete_selection(resource, count, chosen, available, preferred)


def _registered_endpoint(manager: DeviceManager, resource: str) -> PluginEndpoint:
    endpoint = manager.endpoint(resource)
    if endpoint is None or endpoint.closed:
        raise _Rejected(f"cannot allocate {resource}: no device plugin is registered for it")
    return endpoint


def _check_existing(manager: DeviceManager, existing: ContainerDevices, count: int) -> None:
    where = f"pod {existing.pod_uid} container {existing.container_name}"
    if len(existing.device_ids) != count:
        raise _Rejected(
            f"{where} changed its request for {existing.resource_name} "
            f"from {len(existing.device_ids)} to {count}"
        )
    healthy = manager.devices.healthy(existing.resource_name)
    if not healthy:
        raise _Rejected(
            f"no healthy {existing.resource_name} devices present; cannot allocate unhealthy devices"
        )
    if not healthy.issuperset(existing.device_ids):
        raise _Rejected(
            f"{where}: previously allocated {existing.resource_name} devices are no longer healthy"
        )


def _device_requests(container: ContainerRequest) -> list[tuple[str, int]]:
    return sorted(
        (name, count)
        for name, count in container.resources.items()
        if count > 0 and is_extended_resource_name(name)
    )


def _validate(
    pod_uid: str, containers: Sequence[ContainerRequest], init_containers: Sequence[ContainerRequest]
) -> None:
    if not isinstance(pod_uid, str) or not pod_uid:
        raise ValueError("pod_uid must be a non-empty string")
    names: set[str] = set()
    for container in [*init_containers, *containers]:
        if not isinstance(container, ContainerRequest):
            raise ValueError(f"expected a ContainerRequest, got {type(container).__name__}")
        if not container.name:
            raise ValueError(f"pod {pod_uid}: a container has an empty name")
        if container.name in names:
            raise ValueError(f"pod {pod_uid}: container name {container.name!r} is used twice")
        names.add(container.name)
        for resource, count in container.resources.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"pod {pod_uid} container {container.name}: {resource} must be a non-negative "
                    f"integer, got {count!r}"
                )


def _check_known_resources(manager: DeviceManager, ordered: list[tuple[ContainerRequest, bool]]) -> None:
    for container, _is_init in ordered:
        for resource, _count in _device_requests(container):
            if not manager.devices.is_known(resource):
                raise AdmissionError(
                    ADMISSION_ERROR_REASON,
                    f"container {container.name} requests {resource}, which no device plugin has registered",
                )


def _check_fit(
    manager: DeviceManager,
    pod_uid: str,
    init_containers: Sequence[ContainerRequest],
    containers: Sequence[ContainerRequest],
) -> None:
    resources = {r for c in [*init_containers, *containers] for r, _n in _device_requests(c)}
    for resource in sorted(resources):
        app_total = sum(c.resources.get(resource, 0) for c in containers)
        init_max = max((c.resources.get(resource, 0) for c in init_containers), default=0)
        effective = max(app_total, init_max)
        needed = effective - len(manager.pods.held_by_pod(pod_uid, resource))
        free = manager.devices.healthy(resource) - manager.pods.in_use(resource)
        if needed > len(free):
            raise AdmissionError(
                f"OutOf{resource}",
                f"node does not have enough {resource}: pod {pod_uid} needs {needed} more, "
                f"{len(free)} healthy and free",
            )


@dataclass(frozen=True)
class ContainerRequest:
    """One container of a pod to admit: its name and its resource limits (name -> count)."""

    name: str
    resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container got: per resource, the device IDs and the plugin's Allocate answer."""

    name: str
    init: bool
    device_ids: Mapping[str, tuple[str, ...]]
    responses: Mapping[str, ContainerAllocateResponse]


@dataclass(frozen=True)
class AdmittedPod:
    pod_uid: str
    containers: tuple[ContainerAllocation, ...]

    def container(self, name: str) -> ContainerAllocation:
        for allocation in self.containers:
            if allocation.name == name:
                return allocation
        raise KeyError(f"pod {self.pod_uid} has no container {name!r}")
