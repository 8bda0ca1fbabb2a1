"""`KubeletEmulator`: the kubelet side of the device-plugin protocol, in-process, over real unix sockets.

Lifecycle, as the kubelet: `start()` reads `kubelet_internal_checkpoint`, deletes every non-directory
file in the plugin directory except the checkpoint (plugin sockets included), and serves
`v1beta1.Registration` on a new `kubelet.sock`. `restart()` is `stop()` then `start()`: plugins must
register again, allocations survive through the checkpoint, and devices read 0 until each plugin's
ListAndWatch reports them again. Not emulated: removing a resource 5 minutes after its plugin left, the
TopologyManager, the PodResources API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import get_args

from gpumgr.node.kubelet_checkpoint import CHECKPOINT_FILE_NAME
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.sim.kubelet.admission import AdmittedPod, ContainerRequest, ResourceOrder, admit_pod, start_pod
from gpumgr.sim.kubelet.changes import ChangeSignal
from gpumgr.sim.kubelet.checkpoint_writer import CheckpointFormat
from gpumgr.sim.kubelet.manager import DeviceManager, RejectedRegistration
from gpumgr.sim.kubelet.protocol import DIAL_TIMEOUT_S, KUBELET_SOCKET_NAME
from gpumgr.sim.kubelet.registration import RegistrationServer

log = logging.getLogger(__name__)


class KubeletEmulator:
    """An emulated kubelet for one node.

    `dial_timeout` bounds the dial back to a registering plugin (the kubelet uses 10 s); `call_timeout`
    bounds every plugin call (PreStartContainer at most 30 s, as the kubelet); `durable=False` skips the
    fsyncs of the checkpoint (for benchmarks).
    """

    def __init__(
        self,
        plugin_dir: Path | str,
        checkpoint_format: CheckpointFormat = "v2",
        *,
        dial_timeout: float = DIAL_TIMEOUT_S,
        call_timeout: float = 30.0,
        durable: bool = True,
    ) -> None:
        if checkpoint_format not in get_args(CheckpointFormat):
            raise ValueError(f"checkpoint_format must be 'v1' or 'v2', not {checkpoint_format!r}")
        self.plugin_dir = Path(plugin_dir).absolute()
        self._signal = ChangeSignal()
        self._manager = DeviceManager(
            self.plugin_dir,
            checkpoint_format,
            self._signal,
            dial_timeout=dial_timeout,
            call_timeout=call_timeout,
            durable=durable,
        )
        self._server = RegistrationServer(self.plugin_dir / KUBELET_SOCKET_NAME, self._manager.register)
        self._lock = asyncio.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server.serving:
            raise RuntimeError(f"kubelet emulator in {self.plugin_dir} is already running")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._manager.load_checkpoint()
        removed = cleanup_plugin_directory(self.plugin_dir)
        if removed:
            log.info("kubelet start: removed %s from %s", ", ".join(sorted(removed)), self.plugin_dir)
        await self._server.start()
        self._signal.notify()

    async def stop(self) -> None:
        await self._server.stop()
        await self._manager.close_endpoints()

    async def restart(self) -> None:
        """Like a kubelet restart: stop, clean the directory, reload the checkpoint, serve a new socket."""
        async with self._lock:
            await self.stop()
            await self.start()

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def use_preferred(self) -> bool:
        """Whether admission asks plugins that offer it for GetPreferredAllocation (True, as kubelets since
        1.19); False takes the sorted free set, as older kubelets did."""
        return self._manager.use_preferred

    @use_preferred.setter
    def use_preferred(self, value: bool) -> None:
        self._manager.use_preferred = value

    @property
    def socket_path(self) -> Path:
        return self._server.socket_path

    @property
    def checkpoint_path(self) -> Path:
        return self._manager.checkpoint_path

    @property
    def running(self) -> bool:
        return self._server.serving

    # -- pods -----------------------------------------------------------------------------------------

    async def admit_pod(
        self,
        pod_uid: str,
        containers: Sequence[ContainerRequest],
        init_containers: Sequence[ContainerRequest] = (),
        resource_order: ResourceOrder = "sorted",
        start: bool = True,
    ) -> AdmittedPod:
        """Admit a pod (one at a time); raises AdmissionError if it is rejected, ValueError on bad input.
        See `gpumgr.sim.kubelet.admission` for the exact sequence of plugin calls. `start=False`: admitted
        only; `start_pod` later calls PreStartContainer."""
        async with self._lock:
            return await admit_pod(self._manager, pod_uid, containers, init_containers, resource_order, start)

    async def start_pod(self, pod: AdmittedPod) -> None:
        """Start the containers of a pod admitted with `start=False` (PreStartContainer each, in order)."""
        await start_pod(self._manager, pod)

    async def remove_pod(self, pod_uid: str) -> bool:
        """Free the pod's devices and rewrite the checkpoint; False if it held nothing."""
        async with self._lock:
            removed = self._manager.pods.remove_pod(pod_uid)
            if removed:
                await self._manager.write_checkpoint()
                self._signal.notify()
            return removed

    def pods(self) -> list[str]:
        return self._manager.pods.pods()

    def pod_devices(self, pod_uid: str) -> dict[str, dict[str, tuple[str, ...]]]:
        """Container name -> resource -> device IDs held."""
        return self._manager.pods.pod_view(pod_uid)

    def allocated(self, resource: str) -> set[str]:
        return self._manager.pods.in_use(resource)

    # -- observation ----------------------------------------------------------------------------------

    @property
    def registrations(self) -> dict[str, list[float]]:
        """Resource -> `time.monotonic()` of every accepted registration (kept across restarts)."""
        return {r: list(times) for r, times in self._manager.registrations.items()}

    def registration_count(self, resource: str) -> int:
        return len(self._manager.registrations.get(resource, ()))

    @property
    def rejected_registrations(self) -> list[RejectedRegistration]:
        return list(self._manager.rejected)

    def is_registered(self, resource: str) -> bool:
        """True while a registered plugin's endpoint for `resource` is connected."""
        endpoint = self._manager.endpoint(resource)
        return endpoint is not None and not endpoint.closed

    async def wait_registered(self, resource: str, timeout: float, *, count: int | None = None) -> float:
        """Wait until `resource` has a connected plugin (and, with `count`, at least that many accepted
        registrations in total). Returns the time of the latest one; TimeoutError after `timeout` s."""

        def done() -> bool:
            enough = count is None or self.registration_count(resource) >= count
            return enough and self.is_registered(resource)

        await self._signal.wait_for(done, timeout)
        return self._manager.registrations[resource][-1]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait until `predicate()` holds, re-checked after every state change; TimeoutError on timeout."""
        await self._signal.wait_for(predicate, timeout)

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> "Healthy"/"Unhealthy" as last reported (all Unhealthy once the stream broke)."""
        return self._manager.devices.health(resource)

    def topology(self, resource: str) -> dict[str, tuple[int, ...]]:
        """Device ID -> NUMA node IDs from Device.topology."""
        return self._manager.devices.topology(resource)

    def capacity(self, resource: str) -> int:
        return len(self._manager.devices.health(resource))

    def allocatable(self, resource: str) -> int:
        """Healthy devices (allocated or not), as the kubelet reports node allocatable."""
        return len(self._manager.devices.healthy(resource))

    def options(self, resource: str) -> pb.DevicePluginOptions | None:
        endpoint = self._manager.endpoint(resource)
        return endpoint.options if endpoint is not None else None

    @property
    def last_checkpoint_error(self) -> str | None:
        """Why the checkpoint could not be read at the last (re)start, if it could not."""
        return self._manager.last_checkpoint_error


def cleanup_plugin_directory(plugin_dir: Path) -> list[str]:
    """Delete every non-directory entry of `plugin_dir` except the kubelet checkpoint; return the names."""
    removed: list[str] = []
    for entry in plugin_dir.iterdir():
        if entry.name == CHECKPOINT_FILE_NAME or entry.is_dir():
            continue
        try:
            entry.unlink()
        except FileNotFoundError:
            continue
        removed.append(entry.name)
    return removed
