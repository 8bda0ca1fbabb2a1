"""The device plugin of a *shared* MIG profile: each ready instance of the profile is offered as `replicas` devices
of `<prefix><profile>.shared` (the name NVIDIA's time-slicing gives with `renameByDefault`, so manifests carry
over), IDs `<MIG UUID>::<n>`. Unlike time-slicing, a replica is a share the node enforces: memory = the instance's
memory / replicas (the vCUDA shim's memory limit, inside the instance), cores 100 / replicas.

Allocate of k replicas (all of one instance; GetPreferredAllocation keeps them together) records an allocation
inside the instance's ledger slot (`Allocation.mig`, k/replicas of its memory and cores) before answering, and
answers as a `tencent.com/vcuda-*` container gets answered (the vDevice directory mounted at /etc/vcuda, the shim and
its environment) plus the MIG parts: the parent's device node, the instance's GI/CI capability nodes, /dev/nvidiactl,
`NVIDIA_VISIBLE_DEVICES=<MIG UUID>` and, with CDI, `<kind>=<MIG UUID>`. PreStartContainer learns the container from
the kubelet checkpoint, names it in the ledger, writes its limits file and starts its vDevice server. Released when
the kubelet no longer records it for a live pod (gpumgr/mig/holdings.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import grpc

from gpumgr.allocator import Allocation, ContainerHolder, Ledger, LedgerError
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.deviceplugin import mig as whole
from gpumgr.deviceplugin import response
from gpumgr.mig.caps import CapsError, instance_nodes, read_minors
from gpumgr.node.kubelet_checkpoint import KubeletCheckpointError, find_owners
from gpumgr.node.limits import bus_ids, with_compute
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.vdevice.layout import allocation_key
from gpumgr.vdevice.limits import DeviceLimit, Limits

if TYPE_CHECKING:
    from gpumgr.agent.base import ServiceBase

log = logging.getLogger("gpumgr.deviceplugin.mig")
SUFFIX = ".shared"
SEP = "::"
MAX_REPLICAS = 64
OWNER_WAIT_S = 3.0


def shared_resource(profile: str, prefix: str = whole.DEFAULT_PREFIX) -> str:
    return whole.resource_name(profile, prefix) + SUFFIX


def shared_socket(profile: str) -> str:
    return "gpumgr-mig-" + profile.replace("+", "-") + "-shared.sock"


def replica_id(uuid: str, n: int) -> str:
    return f"{uuid}{SEP}{n}"


def split_id(device_id: str) -> tuple[str, int] | None:
    uuid, sep, n = device_id.rpartition(SEP)
    return (uuid, int(n)) if sep and uuid and n.isdigit() and len(n) <= 3 else None


def share_of(slot: MigSlot, count: int, replicas: int) -> tuple[int, int]:
    """(cores, memory MiB) of `count` replicas of `slot`."""
    if count >= replicas:
        return 100, slot.memory_mib
    return 100 * count // replicas, slot.memory_mib * count // replicas


def share_limits(slot: MigSlot, card_index: int, alloc: Allocation) -> Limits:
    """The limits of a share inside an instance: its memory on the MIG UUID, its cores (the DeviceLimit names the
    instance, not its parent card)."""
    holder = alloc.container_holder
    whole_instance = alloc.cores >= 100
    return Limits(pod_uid=holder.pod_uid if holder else "", container_name=holder.container if holder else "",
                  core_limit=0 if whole_instance else alloc.cores, hard_limit=True, core_ceiling=0,
                  devices=(DeviceLimit(slot.uuid, card_index, 0 if whole_instance else alloc.memory_mib << 20),))


class MigSharedServicer(whole.MigPluginServicer):
    def __init__(self, service: ServiceBase, profile: str, resource: str, replicas: int, health: whole.MigHealth,
                 config: whole.MigPluginConfig | None = None):
        super().__init__(service.state, profile, resource, health, config)
        if not 2 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"{resource}: replicas must be 2..{MAX_REPLICAS}, got {replicas}")
        self.service = service
        self.replicas = replicas

    def devices(self) -> list[pb.Device]:
        return [pb.Device(ID=replica_id(d.ID, n), health=d.health) for d in super().devices()
                for n in range(self.replicas)]

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    async def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext) -> pb.PreferredAllocationResponse:  # noqa: N802,E501
        """k replicas of one instance: the one with the fewest free replicas that still has k (packs shares)."""
        out = pb.PreferredAllocationResponse()
        for creq in request.container_requests:
            size = creq.allocation_size
            must = list(creq.must_include_deviceIDs)
            by_uuid: dict[str, list[str]] = {}
            for d in list(creq.available_deviceIDs)[:MAX_REPLICAS * 1024]:
                parts = split_id(d)
                if parts:
                    by_uuid.setdefault(parts[0], []).append(d)
            pick: list[str] = []
            fits = [ids for ids in by_uuid.values() if len(ids) >= size
                    and all(m in ids for m in must)]
            if fits and size > 0:
                best = min(fits, key=len)
                rest = [d for d in sorted(best) if d not in must]
                pick = [*must, *rest[:max(0, size - len(must))]]
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=pick))
        return out

    async def Allocate(self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext) -> pb.AllocateResponse:  # noqa: N802
        by_uuid = {s.uuid: s for s in self.slots()}
        wanted: list[tuple[MigSlot, list[str]]] = []
        for creq in request.container_requests:
            ids = sorted(set(creq.devices_ids))
            if not ids or len(ids) != len(creq.devices_ids) or len(ids) > self.replicas:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{self.resource}: a container asks 1..{self.replicas} distinct replicas, got "
                                    f"{len(creq.devices_ids)}")
            parts = [split_id(i) for i in ids]
            bad = next((i for i, p in zip(ids, parts, strict=True) if p is None or p[0] not in by_uuid
                        or p[1] >= self.replicas), None)
            if bad is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{self.resource}: no replica {bad[:80]!r} of a {self.profile} instance on this "
                                    "node (destroyed by a layout change?)")
            uuids = {p[0] for p in parts if p}
            if len(uuids) != 1:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{self.resource}: the replicas of one container must be of one MIG instance "
                                    f"(a share lives inside one instance), got {len(uuids)} instances")
            wanted.append((by_uuid[uuids.pop()], ids))
        try:
            minors = await self.state.run_io(read_minors, self.config.mig_minors)  # off the event loop
            nodes = [instance_nodes(minors, self.state.inventory.gpus[s.card].minor, s.gi or 0, s.ci or 0,
                                    self.config.mig_minors) for s, _ in wanted]
        except CapsError as e:
            log.error("%s: Allocate refused: %s", self.resource, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {e}")
        now = int(time.time())
        allocs = []
        for slot, ids in wanted:
            cores, memory = share_of(slot, len(ids), self.replicas)
            allocs.append(Allocation(key=allocation_key(ids), cards=(slot.card,), cores=cores, memory_mib=memory,
                                     mig=slot.name, ids=tuple(ids), created=now))
        try:
            for a in allocs:  # the directory is mounted: it must exist before anyone is answered
                await self.state.run_io(self.service.layout.prepare, a.key)
            freed: list[Allocation] = await self.state.commit(_hold_shares(allocs))
        except (LedgerError, OSError) as e:
            log.error("%s: Allocate refused: %s", self.resource, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {e}")
        mine = {a.key for a in allocs}
        for d in freed:
            await self.service.vdevices.stop(d.key, remove_dir=d.key not in mine)
        out = pb.AllocateResponse()
        for (slot, ids), a, caps in zip(wanted, allocs, nodes, strict=True):
            out.container_responses.append(self._share_response(slot, a, caps))
            log.info("%s: allocated %s (%d cores, %d MiB of %s; key %s)", self.resource, ids, a.cores, a.memory_mib,
                     slot.uuid, a.key)
        return out

    def _share_response(self, slot: MigSlot, a: Allocation, caps: tuple[str, str]) -> pb.ContainerAllocateResponse:
        gpu = self.state.inventory.gpus[slot.card]
        cfg = self.service.config.response
        resp = response.build(cfg, [gpu], a.cores, a.memory_mib << 20, self.service.layout.dir_for(a.key), a.key)
        parent = f"/dev/nvidia{gpu.minor}"
        at = next(i for i, d in enumerate(resp.devices) if d.host_path == parent) + 1
        for p in reversed(caps):  # the parent, then its GI and CI capability nodes, then nvidiactl and the rest
            resp.devices.insert(at, pb.DeviceSpec(container_path=p, host_path=p, permissions="rw"))
        resp.envs["NVIDIA_VISIBLE_DEVICES"] = slot.uuid
        resp.annotations["gpumgr.io/mig-instances"] = slot.name
        del resp.cdi_devices[:]
        if cfg.cdi or self.config.cdi:
            resp.cdi_devices.append(pb.CDIDevice(name=f"{self.config.cdi_kind}={slot.uuid}"))
        return resp

    async def PreStartContainer(self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext) -> pb.PreStartContainerResponse:  # noqa: N802,E501
        ids = sorted(set(request.devices_ids))
        key = allocation_key(ids)
        a = self.state.ledger.held_by(key)
        slot = self.state.ledger.slots.get(a.mig or "") if a is not None else None
        if a is None or slot is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{self.resource}: these {len(ids)} replicas are not allocated on this node")
            return pb.PreStartContainerResponse()
        owner = await self._owner(ids)
        if owner is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{self.resource}: the kubelet checkpoint names no container holding these replicas; "
                                "refusing to write limits for an unverified container")
            return pb.PreStartContainerResponse()
        try:
            named = await name_share(self.service, key, owner[0], owner[1])
        except LedgerError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {e}")
            return pb.PreStartContainerResponse()
        if named is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{self.resource}: pod {owner[0]} (owner of these replicas per the kubelet) is not "
                                f"on node {self.state.node_name} in the API")
            return pb.PreStartContainerResponse()
        try:
            await start_share_server(self.service, named)
        except (OSError, ValueError, RuntimeError) as e:  # the limits file or the socket could not be made
            log.error("%s: PreStartContainer: vDevice server of %s: %s", self.resource, key, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{self.resource}: cannot start the vDevice server of this share: {e}")
        return pb.PreStartContainerResponse()

    async def _owner(self, ids: list[str]) -> tuple[str, str] | None:
        deadline = time.monotonic() + OWNER_WAIT_S
        fresh = False
        while True:
            try:
                ckpt = await self.service.kubelet_checkpoint(fresh=fresh)
                owners = find_owners(ckpt.entries, self.resource, ids)
                if owners:
                    return owners[0]
            except KubeletCheckpointError as e:
                log.warning("%s: kubelet checkpoint unreadable: %s", self.resource, e)
            fresh = True
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)


async def name_share(service: ServiceBase, key: str, uid: str, container: str) -> Allocation | None:
    """Name the container holding `key` (verified, from the kubelet's record); None when its pod is not known."""
    pod = service.pods.get(uid)
    if pod is None:
        await service._refresh_quietly(10.0)  # noqa: SLF001 - the service's one bounded live list
        pod = service.pods.get(uid)
    if pod is None:
        return None
    holder = holder_of(pod, container)

    def change(led: Ledger) -> Allocation:
        a = led.held_by(key)
        if a is None:
            raise LedgerError(f"{key} is no longer allocated")
        named = replace(a, holder=holder, verified=True)
        if named != a:
            led.release(key)
            led.assign(named, check_health=False)
        return named

    result: Allocation = await service.state.commit(change)
    return result


def holder_of(pod: Mapping[str, Any], container: str) -> ContainerHolder:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    inits = [c.get("name") for c in spec.get("initContainers") or []]
    apps = [c.get("name") for c in spec.get("containers") or []]
    init = container in inits and container not in apps
    index = (inits if init else apps).index(container) if container in (inits if init else apps) else 0
    return ContainerHolder(pod_uid=str(meta.get("uid", "")), namespace=str(meta.get("namespace", "")),
                           pod=str(meta.get("name", "")), container=container, container_index=index, init=init)


async def start_share_server(service: ServiceBase, a: Allocation) -> Limits | None:
    """(Re)start the vDevice server of a named share inside an instance; returns its limits."""
    slot = service.state.ledger.slots.get(a.mig or "")
    if slot is None or a.container_holder is None:
        return None
    limits = with_compute(service.state.inventory, share_limits(slot, slot.card, a), mig=True)
    if service.vdevices.running().get(a.key) != limits:
        await service.vdevices.start(a.key, limits, bus_ids(service.state.inventory, [slot.card]))
        log.info("MIG share %s: vDevice server for %s/%s container %s (%d MiB, %d cores of %s)", a.key, a.namespace,
                 a.pod, a.container, a.memory_mib, a.cores, slot.uuid)
    return limits


def is_share(a: Allocation) -> bool:
    """A share inside an instance made by the shared plugin (its replica IDs are recorded)."""
    return a.mig is not None and bool(a.ids) and all(SEP in i for i in a.ids)


def _hold_shares(allocs: list[Allocation]) -> Callable[[Ledger], list[Allocation]]:
    def change(led: Ledger) -> list[Allocation]:
        freed = []
        for a in allocs:
            have = led.held_by(a.key)
            if have is not None and have.mig == a.mig and have.ids == a.ids:
                continue  # the kubelet asking again for the same replicas: the same holding
            ids = set(a.ids)
            for key, h in list(led.allocations.items()):  # the kubelet hands out only replicas nobody runs with
                if h.mig == a.mig and ids & set(h.ids):
                    freed.append(led.release(key))
            led.assign(a)
        return [f for f in freed if f is not None]
    return change
