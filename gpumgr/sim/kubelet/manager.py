"""The emulated kubelet device manager: registered endpoints, their devices, pod allocations and the
checkpoint that records them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpumgr.node.kubelet_checkpoint import (
    CHECKPOINT_FILE_NAME,
    NUMA_WITHOUT_TOPOLOGY,
    KubeletCheckpoint,
    KubeletCheckpointError,
    read_kubelet_checkpoint,
)
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.sim.kubelet.changes import ChangeSignal
from gpumgr.sim.kubelet.checkpoint_writer import (
    CheckpointFormat,
    checkpoint_data,
    render_checkpoint,
    write_checkpoint,
)
from gpumgr.sim.kubelet.device_registry import DeviceRegistry
from gpumgr.sim.kubelet.endpoint import EndpointError, PluginEndpoint
from gpumgr.sim.kubelet.pod_devices import ContainerDevices, PodDevices
from gpumgr.sim.kubelet.protocol import endpoint_path
from gpumgr.sim.kubelet.registration import RegistrationRejected, check_register_request

log = logging.getLogger(__name__)


class DeviceManager:
    """State of the emulated kubelet's device manager. All methods run in the event loop."""

    def __init__(
        self,
        plugin_dir: Path,
        checkpoint_format: CheckpointFormat,
        signal: ChangeSignal,
        *,
        dial_timeout: float,
        call_timeout: float,
        durable: bool,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.checkpoint_format: CheckpointFormat = checkpoint_format
        self.signal = signal
        self.devices = DeviceRegistry()
        self.pods = PodDevices()
        self.registrations: dict[str, list[float]] = {}
        self.rejected: list[RejectedRegistration] = []
        self.last_checkpoint_error: str | None = None
        self._endpoints: dict[str, PluginEndpoint] = {}
        self._dial_timeout = dial_timeout
        self._call_timeout = call_timeout
        self._durable = durable
        # False: never call GetPreferredAllocation (as kubelets before 1.19 did): the sorted free set is taken
        self.use_preferred = True
        self._write_lock = asyncio.Lock()

    # -- registration and ListAndWatch -------------------------------------------------------------

    async def register(self, request: pb.RegisterRequest) -> None:
        """Handle one Register: validate, dial back, fetch options, open ListAndWatch."""
        try:
            check_register_request(request)
            path = endpoint_path(self.plugin_dir, request.endpoint)
            try:
                endpoint = await PluginEndpoint.connect(
                    request.resource_name,
                    path,
                    dial_timeout=self._dial_timeout,
                    call_timeout=self._call_timeout,
                )
            except EndpointError as exc:
                raise RegistrationRejected(str(exc)) from exc
        except RegistrationRejected as exc:
            self.rejected.append(RejectedRegistration(request.resource_name, request.endpoint, str(exc)))
            self.signal.notify()
            raise
        resource = request.resource_name
        old = self._endpoints.get(resource)
        self._endpoints[resource] = endpoint
        if old is not None:
            log.info("plugin for %s re-registered at %s; closing %s", resource, path, old.socket_path)
            await old.close()
        self.devices.add_resource(resource)
        self.registrations.setdefault(resource, []).append(time.monotonic())
        endpoint.watch(self._on_devices, self._on_closed)
        log.info("device plugin for %s registered at %s", resource, path)
        self.signal.notify()

    async def _on_devices(self, endpoint: PluginEndpoint, devices: Sequence[pb.Device]) -> None:
        if self._endpoints.get(endpoint.resource) is not endpoint:
            return
        self.devices.replace(endpoint.resource, devices)
        self.signal.notify()
        await self.write_checkpoint()

    async def _on_closed(self, endpoint: PluginEndpoint, reason: str) -> None:
        if self._endpoints.get(endpoint.resource) is not endpoint:
            return
        del self._endpoints[endpoint.resource]
        self.devices.mark_unhealthy(endpoint.resource)
        log.info("device plugin for %s went away (%s): its devices are unhealthy", endpoint.resource, reason)
        self.signal.notify()
        await endpoint.close()

    def endpoint(self, resource: str) -> PluginEndpoint | None:
        return self._endpoints.get(resource)

    async def close_endpoints(self) -> None:
        endpoints = list(self._endpoints.values())
        self._endpoints.clear()
        for endpoint in endpoints:
            await endpoint.close()
        self.signal.notify()

    # -- checkpoint ---------------------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / CHECKPOINT_FILE_NAME

    def load_checkpoint(self) -> None:
        """Replace in-memory allocations with the checkpoint's. Resources it names become known with no
        devices until their plugin registers again. A corrupt file is logged and treated as empty, as the
        kubelet continues after failing to read its checkpoint."""
        try:
            checkpoint = read_kubelet_checkpoint(self.checkpoint_path)
            self.last_checkpoint_error = None
        except KubeletCheckpointError as exc:
            log.warning("%s; continuing without the recorded allocations", exc)
            self.last_checkpoint_error = str(exc)
            checkpoint = KubeletCheckpoint(entries=(), registered_devices={})
        self.pods.replace_all(
            ContainerDevices(
                pod_uid=e.pod_uid,
                container_name=e.container_name,
                resource_name=e.resource_name,
                device_ids=e.device_ids,
                numa=e.numa_device_ids or ((NUMA_WITHOUT_TOPOLOGY, e.device_ids),),
                alloc_resp=e.alloc_resp,
            )
            for e in checkpoint.entries
        )
        self.devices.clear()
        for resource in [*checkpoint.registered_devices, *(e.resource_name for e in checkpoint.entries)]:
            self.devices.add_resource(resource)
        self.signal.notify()

    async def write_checkpoint(self) -> None:
        """Write the current state; writes are serialized and each writes the state as it is then."""
        async with self._write_lock:
            data = checkpoint_data(
                [e for e in self.pods.entries() if not e.in_flight],
                {r: self.devices.healthy(r) for r in self.devices.resources()},
                self.checkpoint_format,
            )
            await asyncio.to_thread(self._render_and_write, data)
        self.signal.notify()

    def _render_and_write(self, data: dict[str, object]) -> None:
        write_checkpoint(self.plugin_dir, render_checkpoint(data), durable=self._durable)

    def numa_groups(
        self, resource: str, device_ids: Sequence[str]
    ) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Group IDs by NUMA node as the kubelet checkpoints them: under every node of a device's
        topology, or under "-1" when it has none."""
        groups: dict[str, list[str]] = {}
        for device_id in device_ids:
            nodes = self.devices.numa_nodes(resource, device_id)
            for key in [str(n) for n in nodes] or [NUMA_WITHOUT_TOPOLOGY]:
                groups.setdefault(key, []).append(device_id)
        return tuple((key, tuple(ids)) for key, ids in groups.items())


@dataclass(frozen=True)
class RejectedRegistration:
    resource: str
    endpoint: str
    message: str
