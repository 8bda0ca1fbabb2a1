"""The kubelet's client for one registered device plugin: dial back, options, ListAndWatch, the calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.sim.kubelet.protocol import PRE_START_TIMEOUT_S, UNIX_PATH_MAX

log = logging.getLogger(__name__)

DeviceListHandler = Callable[["PluginEndpoint", Sequence[pb.Device]], Awaitable[None]]
StreamClosedHandler = Callable[["PluginEndpoint", str], Awaitable[None]]


class EndpointError(Exception):
    """Dialing the plugin or one of its calls failed; `code`/`details` carry the gRPC status if any."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class PluginEndpoint:
    """A connected plugin. Create with `connect()`; `watch()` consumes ListAndWatch in a task."""

    def __init__(
        self,
        resource: str,
        socket_path: Path,
        channel: grpc.aio.Channel,
        options: pb.DevicePluginOptions,
        call_timeout: float,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = options
        self._channel = channel
        self._stub = pb_grpc.DevicePluginStub(channel)
        self._call_timeout = call_timeout
        self._watch_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def connect(
        cls, resource: str, socket_path: Path, *, dial_timeout: float, call_timeout: float
    ) -> PluginEndpoint:
        """Dial `socket_path` (bounded by `dial_timeout`) and fetch the plugin's options."""
        if len(str(socket_path).encode()) > UNIX_PATH_MAX:
            raise EndpointError(f"endpoint socket path {socket_path} is longer than {UNIX_PATH_MAX} bytes")
        channel = grpc.aio.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.default_authority", "localhost")]
        )
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), dial_timeout)
            except TimeoutError as exc:
                raise EndpointError(
                    f"cannot dial device plugin at {socket_path} within {dial_timeout:g}s"
                ) from exc
            stub = pb_grpc.DevicePluginStub(channel)
            try:
                options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=call_timeout)
            except grpc.aio.AioRpcError as exc:
                raise _rpc_error("GetDevicePluginOptions", socket_path, exc) from exc
        except BaseException:
            await channel.close()
            raise
        return cls(resource, socket_path, channel, options, call_timeout)

    def watch(self, on_devices: DeviceListHandler, on_closed: StreamClosedHandler) -> None:
        """Open ListAndWatch and feed every message (the complete device list) to `on_devices`.

        When the stream ends or fails (not through `close()`), `on_closed` gets the reason.
        """
        self._watch_task = asyncio.get_running_loop().create_task(
            self._consume(on_devices, on_closed), name=f"kubelet-listandwatch-{self.resource}"
        )

    async def _consume(self, on_devices: DeviceListHandler, on_closed: StreamClosedHandler) -> None:
        reason = "stream ended"
        try:
            call = self._stub.ListAndWatch(pb.Empty())
            async for response in call:
                await on_devices(self, list(response.devices))
        except grpc.aio.AioRpcError as exc:
            reason = f"stream failed: {exc.code().name}: {exc.details()}"
        if not self._closed:
            log.info("ListAndWatch of %s at %s closed: %s", self.resource, self.socket_path, reason)
            await on_closed(self, reason)

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = await self._call("GetPreferredAllocation", self._stub.GetPreferredAllocation, request)
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        response = await self._call("Allocate", self._stub.Allocate, request)
        if not response.container_responses:
            raise EndpointError(f"Allocate on {self.socket_path} returned no container response")
        return response.container_responses[0]

    async def pre_start_container(self, device_ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=device_ids)
        await self._call(
            "PreStartContainer",
            self._stub.PreStartContainer,
            request,
            timeout=min(self._call_timeout, PRE_START_TIMEOUT_S),
        )

    async def _call(
        self, name: str, method: Callable[..., Any], request: Any, timeout: float | None = None
    ) -> Any:
        if self._closed:
            raise EndpointError(f"{name}: endpoint for {self.resource} is stopped")
        try:
            return await method(request, timeout=timeout or self._call_timeout)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(name, self.socket_path, exc) from exc
        except asyncio.CancelledError:
            # the endpoint was replaced (the plugin re-registered) while this call was in flight: the call fails,
            # as it does in the kubelet; only a cancellation of our own task propagates
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise EndpointError(f"{name}: endpoint for {self.resource} closed during the call") from None
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop watching and close the channel; `on_closed` is not called for this."""
        if self._closed:
            return
        self._closed = True
        task = self._watch_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._channel.close()


def _rpc_error(name: str, socket_path: Path, exc: grpc.aio.AioRpcError) -> EndpointError:
    code = exc.code()
    details = exc.details() or ""
    return EndpointError(f"{name} on {socket_path} failed: {code.name}: {details}", code, details)
