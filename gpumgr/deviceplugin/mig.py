"""The device plugin of one MIG profile (`nvidia.com/mig-<profile>` by default, the names of NVIDIA's `mixed`
strategy, so manifests written for it work): its devices are the ready instances of that profile in the
node's static layout, one per MIG UUID.

Allocate answers with the parent's /dev/nvidia<minor> and /dev/nvidiactl, the instance's GI and CI capability
nodes (/dev/nvidia-caps/nvidia-cap<M>, from mig-minors), `NVIDIA_VISIBLE_DEVICES=<MIG UUID>` and, with CDI on, the
CDI name `<kind>=<MIG UUID>`; the instance is recorded as held whole in the ledger (checkpointed before the answer).
The kubelet hands a device out only when no running pod has it, so an Allocate of a held instance replaces the
old holder; gpumgr/mig/holdings.py names the holder from the kubelet checkpoint and releases it when its pod
goes. Health: an instance in `unhealthy` (an XID or ECC event naming it) is Unhealthy; its card's other
instances are not.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.devices.types import Inventory
from gpumgr.mig.caps import MIG_MINORS, CapsError, instance_nodes, read_minors
from gpumgr.node.state import NodeState
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger("gpumgr.deviceplugin.mig")
DEFAULT_PREFIX = "nvidia.com/mig-"
_MAX_IDS = 64


def resource_name(profile: str, prefix: str = DEFAULT_PREFIX) -> str:
    return prefix + profile


def socket_name(profile: str) -> str:
    return "gpumgr-mig-" + profile.replace("+", "-") + ".sock"


def allocation_key(uuid: str) -> str:
    """The ledger key of a device-plugin holding of one instance (the agent's key shape: a + 24 hex digits)."""
    return "a" + hashlib.sha256(uuid.encode()).hexdigest()[:24]


@dataclass
class MigHealth:
    """Unhealthy instances by slot name, with the reason (XID / ECC on that instance)."""

    reasons: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MigPluginConfig:
    mig_minors: Path = MIG_MINORS
    cdi: bool = False
    cdi_kind: str = "nvidia.com/gpu"


class MigPluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, state: NodeState, profile: str, resource: str, health: MigHealth,
                 config: MigPluginConfig | None = None):
        self.state = state
        self.profile = profile
        self.resource = resource
        self.health = health
        self.config = config or MigPluginConfig()

    def slots(self) -> list[MigSlot]:
        return sorted((s for s in self.state.ledger.slots.values() if s.profile == self.profile and s.ready),
                      key=lambda s: (s.card, s.start))

    def devices(self) -> list[pb.Device]:
        return [pb.Device(ID=s.uuid, health="Unhealthy" if s.name in self.health.reasons
                          or not self.state.ledger.card(s.card).healthy else "Healthy") for s in self.slots()]

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    async def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.DevicePluginOptions:  # noqa: N802,E501
        return self.options()

    async def ListAndWatch(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802,E501
        sent: list[tuple[str, str]] | None = None
        version = -1
        while True:
            devices = self.devices()
            now = [(d.ID, d.health) for d in devices]
            if now != sent:
                sent = now
                yield pb.ListAndWatchResponse(devices=devices)
                log.info("%s: sent %d instances (unhealthy: %s)", self.resource, len(now),
                         [i for i, h in now if h != "Healthy"] or "none")
            version = await self.state.wait_change(version, timeout=5.0)

    async def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext) -> pb.PreferredAllocationResponse:  # noqa: N802,E501
        return pb.PreferredAllocationResponse()

    async def PreStartContainer(self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext) -> pb.PreStartContainerResponse:  # noqa: N802,E501
        return pb.PreStartContainerResponse()

    async def Allocate(self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext) -> pb.AllocateResponse:  # noqa: N802
        out = pb.AllocateResponse()
        by_uuid = {s.uuid: s for s in self.slots()}
        wanted: list[list[MigSlot]] = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            if not ids or len(ids) > _MAX_IDS:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{self.resource}: a container asks 1..{_MAX_IDS} instances, got {len(ids)}")
            unknown = [i for i in ids if i not in by_uuid]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{self.resource}: no {self.profile} instance {unknown[0][:80]!r} on this node "
                                    "(destroyed by a layout change?)")
            wanted.append([by_uuid[i] for i in ids])
        try:
            minors = await self.state.run_io(read_minors, self.config.mig_minors)  # off the event loop
            responses = [self._response(slots, minors) for slots in wanted]
        except CapsError as e:
            log.error("%s: Allocate refused: %s", self.resource, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {e}")
        try:
            await self.state.commit(_hold([s for slots in wanted for s in slots]))
        except (LedgerError, OSError) as e:  # the instance went meanwhile, or the checkpoint could not be written
            log.error("%s: Allocate refused: %s", self.resource, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {e}")
        out.container_responses.extend(responses)
        log.info("%s: allocated %s", self.resource, [s.uuid for slots in wanted for s in slots])
        return out

    def _response(self, slots: list[MigSlot], minors: dict[str, int]) -> pb.ContainerAllocateResponse:
        inv: Inventory = self.state.inventory
        resp = pb.ContainerAllocateResponse()
        paths: list[str] = []
        for s in slots:
            paths.append(f"/dev/nvidia{inv.gpus[s.card].minor}")
            paths += instance_nodes(minors, inv.gpus[s.card].minor, s.gi or 0, s.ci or 0, self.config.mig_minors)
        for p in dict.fromkeys([*paths, "/dev/nvidiactl"]):
            resp.devices.append(pb.DeviceSpec(container_path=p, host_path=p, permissions="rw"))
        resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(s.uuid for s in slots)
        resp.annotations["gpumgr.io/mig-instances"] = ",".join(s.name for s in slots)
        if self.config.cdi:
            for s in slots:
                resp.cdi_devices.append(pb.CDIDevice(name=f"{self.config.cdi_kind}={s.uuid}"))
        return resp


def _hold(slots: list[MigSlot]) -> Callable[[Ledger], None]:
    def change(led: Ledger) -> None:
        for s in slots:
            for key in list(led.slot_holders.get(s.name, {})):  # the kubelet only hands out a free device
                led.release(key)
            led.assign(Allocation(key=allocation_key(s.uuid), cards=(s.card,), cores=100, mig=s.name,
                                  created=int(time.time())))
    return change


def mark(health: MigHealth, ledger: Ledger, card: int, gi: int | None, reason: str | None) -> str | None:
    """An event on card `card`'s GPU instance `gi` marks that instance only (reason None: it cleared). Returns
    the slot name marked, or None when no instance of the ledger is named (a card-wide event: card health)."""
    if gi is None:
        return None
    slot = next((s for s in ledger.slots.values() if s.card == card and s.gi == gi), None)
    if slot is None:
        return None
    if reason is None:
        health.reasons.pop(slot.name, None)
    else:
        health.reasons[slot.name] = reason
    return slot.name
