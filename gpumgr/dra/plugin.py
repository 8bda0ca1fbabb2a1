"""The kubelet-facing gRPC services on the DRA socket: `DRAPlugin` (prepare / unprepare) and
`DRAResourceHealth` (the cards' health as a stream).

Each claim is answered on its own: a claim that fails gets its `error`, the others are prepared. Claims of one
call run concurrently; the same claim twice is serialised by the preparer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from gpumgr.dra.claims import ClaimError
from gpumgr.dra.config import DraConfig
from gpumgr.dra.preparer import ClaimPreparer
from gpumgr.dra.slices import device_name
from gpumgr.node.state import NodeState
from gpumgr.pb import dra_pb2 as pb
from gpumgr.pb import dra_pb2_grpc as pb_grpc
from gpumgr.pb import drahealth_pb2 as hpb
from gpumgr.pb import drahealth_pb2_grpc as hpb_grpc

log = logging.getLogger("gpumgr.dra.plugin")
MAX_MESSAGE = 1024
HEALTH_TIMEOUT_S = 60
HEALTH_PERIOD_S = 30.0


class DraPluginServicer(pb_grpc.DRAPluginServicer):
    def __init__(self, cfg: DraConfig, preparer: ClaimPreparer):
        self.cfg = cfg
        self.preparer = preparer

    async def _too_many(self, n: int, context: grpc.aio.ServicerContext) -> None:
        if n > self.cfg.max_claims_per_call:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{n} claims in one call; at most {self.cfg.max_claims_per_call}")

    async def NodePrepareResources(self, request: pb.NodePrepareResourcesRequest,  # noqa: N802
                                   context: grpc.aio.ServicerContext) -> pb.NodePrepareResourcesResponse:
        await self._too_many(len(request.claims), context)
        resp = pb.NodePrepareResourcesResponse()
        claims = _unique(request.claims)
        results = await asyncio.gather(*(self._prepare_one(c) for c in claims))
        for c, result in zip(claims, results, strict=True):
            resp.claims[c.uid].CopyFrom(result)
        return resp

    async def _prepare_one(self, c: pb.Claim) -> pb.NodePrepareResourceResponse:
        try:
            devices = await self.preparer.prepare(c.namespace, c.name, c.uid)
        except ClaimError as e:
            log.warning("NodePrepareResources: %s", e)
            return pb.NodePrepareResourceResponse(error=str(e))
        except Exception as e:  # noqa: BLE001 - one claim's failure must not fail the call
            log.exception("NodePrepareResources: claim %s/%s failed", c.namespace, c.name)
            return pb.NodePrepareResourceResponse(error=f"claim {c.namespace}/{c.name}: internal error: {e}")
        return pb.NodePrepareResourceResponse(devices=[
            pb.Device(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                      cdi_device_ids=list(d.cdi_ids)) for d in devices])

    async def NodeUnprepareResources(self, request: pb.NodeUnprepareResourcesRequest,  # noqa: N802
                                     context: grpc.aio.ServicerContext) -> pb.NodeUnprepareResourcesResponse:
        await self._too_many(len(request.claims), context)
        resp = pb.NodeUnprepareResourcesResponse()
        claims = _unique(request.claims)
        results = await asyncio.gather(*(self._unprepare_one(c) for c in claims))
        for c, error in zip(claims, results, strict=True):
            resp.claims[c.uid].error = error
        return resp

    async def _unprepare_one(self, c: pb.Claim) -> str:
        try:
            await self.preparer.unprepare(c.uid)
        except ClaimError as e:
            return str(e)
        except Exception as e:  # noqa: BLE001
            log.exception("NodeUnprepareResources: claim %s/%s failed", c.namespace, c.name)
            return f"claim {c.namespace}/{c.name}: internal error: {e}"
        return ""


def _unique(claims: object) -> list[pb.Claim]:
    seen: dict[str, pb.Claim] = {}
    for c in claims:  # type: ignore[attr-defined]
        seen.setdefault(c.uid, c)
    return list(seen.values())


class DraHealthServicer(hpb_grpc.DRAResourceHealthServicer):
    """Each response is the complete list, stamped with the time it is sent: at once, on every change, and
    every HEALTH_PERIOD_S without one, well inside HEALTH_TIMEOUT_S, so the kubelet never marks a quiet card
    Unknown."""

    def __init__(self, cfg: DraConfig, state: NodeState, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.state = state
        self.clock = clock

    def snapshot(self) -> hpb.NodeWatchResourcesResponse:
        st = self.state
        now = int(self.clock())
        out = hpb.NodeWatchResourcesResponse()
        for g in st.inventory.gpus:
            reasons = sorted(st.health_reasons.get(g.index, ()))
            out.devices.append(hpb.DeviceHealth(
                device=hpb.DeviceIdentifier(pool_name=self.cfg.node_name, device_name=device_name(g.index)),
                health=hpb.UNHEALTHY if reasons else hpb.HEALTHY, last_updated_time=now,
                health_check_timeout_seconds=HEALTH_TIMEOUT_S, message=("; ".join(reasons))[:MAX_MESSAGE]))
        return out

    async def NodeWatchResources(self, request: hpb.NodeWatchResourcesRequest,  # noqa: N802
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[hpb.NodeWatchResourcesResponse]:
        loop = asyncio.get_running_loop()
        version = self.state.version
        last = self.snapshot()
        sent = loop.time()
        yield last
        while True:
            # a health change wakes this early (other node changes do not send); a quiet period ends with the
            # same list, freshly stamped
            version = await self.state.wait_change(version, timeout=max(0.0, sent + HEALTH_PERIOD_S - loop.time()))
            now = self.snapshot()
            if loop.time() - sent >= HEALTH_PERIOD_S or _health(now) != _health(last):
                last, sent = now, loop.time()
                yield now


def _health(resp: hpb.NodeWatchResourcesResponse) -> list[tuple[int, str]]:
    return [(d.health, d.message) for d in resp.devices]
