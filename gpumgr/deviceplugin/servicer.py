"""The DevicePlugin gRPC service of one resource, over the allocation service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from gpumgr.agent.errors import PluginError
from gpumgr.agent.service import AllocationService
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger("gpumgr.deviceplugin")

# How long a call waits for the agent to finish starting before it is refused: under the kubelet's 30 s deadline
# for PreStartContainer, and short because the kubelet admits pods one at a time while it waits for Allocate.
READY_WAIT_S = 25.0


class PluginServicer(pb_grpc.DevicePluginServicer):
    """`kind` is "c" (vcuda-core) or "m" (vcuda-memory).

    `ready`, when given, is set once the ledger may be handed out (pods listed, start-up reconcile done): the
    plugin can then register before that, and GetPreferredAllocation, Allocate and PreStartContainer wait for it
    (ListAndWatch does not: the devices and their health are known from the start)."""

    def __init__(self, service: AllocationService, kind: str, resource: str, ready: asyncio.Event | None = None):
        self.service = service
        self.kind = kind
        self.resource = resource
        self.ready = ready
        self._told_waiting = False

    async def _until_ready(self, context: grpc.aio.ServicerContext) -> None:
        if self.ready is None or self.ready.is_set():
            return
        if not self._told_waiting:
            self._told_waiting = True
            log.warning("%s: calls wait for the agent to finish starting (the node's pods listed, the start-up "
                        "reconcile done)", self.resource)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready.wait(), READY_WAIT_S)
        if not self.ready.is_set():
            log.error("%s: refused a call after waiting %.0fs: the agent is still starting (see the log for why the "
                      "node's pods are not listed)", self.resource, READY_WAIT_S)
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"{self.resource}: the gpumgr agent is still starting (the node's pods are not "
                                "listed yet); the kubelet retries")

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=self.kind == "c", get_preferred_allocation_available=True)

    async def _internal(self, method: str, e: Exception, context: grpc.aio.ServicerContext) -> None:
        """The one answer to an unexpected error: its type and text in the log (the traceback at debug level), the
        type only to the kubelet (it lands in pod events, where neither internals nor a traceback belong)."""
        log.error("%s: %s failed: %s: %s", self.resource, method, type(e).__name__, e,
                  exc_info=log.isEnabledFor(logging.DEBUG))
        await context.abort(grpc.StatusCode.INTERNAL, f"{self.resource}: internal error: {type(e).__name__}")

    async def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.DevicePluginOptions:  # noqa: N802,E501
        return self.options()

    async def ListAndWatch(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802,E501
        state = self.service.state
        sent: tuple[bool, ...] | None = None
        version = -1
        while True:
            health = tuple(state.healthy(g.index) for g in state.inventory.gpus)
            if health != sent:
                sent = health
                yield pb.ListAndWatchResponse(devices=self.service.devices(self.kind))
                log.info("%s: sent %d devices (unhealthy cards: %s)", self.resource,
                         len(state.inventory.gpus), [i for i, h in enumerate(health) if not h] or "none")
            version = await state.wait_change(version, timeout=5.0)

    async def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext) -> pb.PreferredAllocationResponse:  # noqa: N802,E501
        await self._until_ready(context)
        out = pb.PreferredAllocationResponse()
        try:
            for creq in request.container_requests:
                out.container_responses.append(
                    pb.ContainerPreferredAllocationResponse(deviceIDs=await self.service.preferred(self.kind, creq)))
        except PluginError as e:
            await context.abort(e.code, f"{self.resource}: {e.message}")
        except Exception as e:  # noqa: BLE001
            await self._internal("GetPreferredAllocation", e, context)
        return out

    async def Allocate(self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext) -> pb.AllocateResponse:  # noqa: N802
        if not request.container_requests:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource}: no container requests")
        await self._until_ready(context)
        out = pb.AllocateResponse()
        done: list[list[str]] = []
        try:
            for creq in request.container_requests:
                ids = list(creq.devices_ids)
                if self.kind == "c":
                    resp, created = await self.service.allocate_core(ids)
                    out.container_responses.append(resp)
                    if created:
                        done.append(ids)
                else:
                    out.container_responses.append(self.service.allocate_memory(ids))
        except PluginError as e:
            for ids in done:  # all or nothing across the containers of one call
                await self.service.release_ids(ids)
            log.warning("%s: Allocate refused: %s", self.resource, e.message)
            await context.abort(e.code, f"{self.resource}: {e.message}")
        except Exception as e:  # noqa: BLE001
            for ids in done:
                await self.service.release_ids(ids)
            await self._internal("Allocate", e, context)
        return out

    async def PreStartContainer(self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext) -> pb.PreStartContainerResponse:  # noqa: N802,E501
        if self.kind != "c":
            return pb.PreStartContainerResponse()
        await self._until_ready(context)
        try:
            await self.service.prestart_core(list(request.devices_ids))
        except PluginError as e:
            log.warning("%s: PreStartContainer refused: %s", self.resource, e.message)
            await context.abort(e.code, f"{self.resource}: {e.message}")
        except Exception as e:  # noqa: BLE001
            await self._internal("PreStartContainer", e, context)
        return pb.PreStartContainerResponse()
