"""NodePrepareResources / NodeUnprepareResources for one claim: the claim from the API -> the ledger (exactly
what the scheduler allocated, through NodeState.commit) -> the vDevice directory, limits and server -> the CDI
spec. All or nothing per claim: a failure at any step undoes the steps before it.

Ledger keys: `dra/<claim uid>/<n>`, one per granted device. vDevice directory: the allocation key of
`dra/<claim uid>`, shared by every container that uses the claim.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpumgr.allocator import Ledger
from gpumgr.allocator.ledger import Allocation, ClaimHolder, LedgerError
from gpumgr.dra import cdi
from gpumgr.dra.claims import (
    ClaimError,
    ClaimGrant,
    check_enforceable,
    check_uid,
    grant_from_claim,
    per_card,
    reserved_pods,
)
from gpumgr.dra.config import DraConfig
from gpumgr.dra.keyed_locks import KeyedLocks
from gpumgr.dra.mig_prepare import MigClaims, MigResult, mig_results_of
from gpumgr.dra.placement import CachedPod, GetPod, require_pod_here
from gpumgr.dra.slices import CORES, MIB, device_name, memory_ceiling
from gpumgr.node.claims import LEDGER_PREFIX, claim_keys, vdevice_key
from gpumgr.node.limits import with_compute
from gpumgr.node.state import NodeState
from gpumgr.node.vdevices import start_server
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.limits import DeviceLimit, Limits
from gpumgr.vdevice.server import VDeviceManager

log = logging.getLogger("gpumgr.dra")
GetClaim = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]  # (namespace, name, uid) -> claim
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ClaimPreparer:
    def __init__(self, cfg: DraConfig, state: NodeState, layout: VDeviceLayout, vdevices: VDeviceManager,
                 get_claim: GetClaim, get_pod: GetPod, cached_pod: CachedPod | None = None):
        self.cfg = cfg
        self.get_pod = get_pod  # a live read of a pod, for one the pod cache does not hold (placement.py)
        self.cached_pod = cached_pod  # this node's pods, as the agent's pod cache holds them
        self.state = state
        self.layout = layout
        self.vdevices = vdevices
        self.get_claim = get_claim
        self.cdi = cdi.CdiDir(cfg.cdi_dir)
        self._locks = KeyedLocks()  # one prepare / unprepare of a claim at a time
        self._running: set[asyncio.Task[list[PreparedDevice]]] = set()
        self.mig: MigClaims | None = None  # claims of MIG devices (dra/mig_prepare.py), when the node has MIG

    def locks_held(self) -> int:
        """Claims with a prepare or unprepare running or waiting."""
        return len(self._locks)

    # -- prepare --------------------------------------------------------------------------------------------
    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        """Prepare one claim, or raise ClaimError (with nothing changed)."""
        check_uid(uid)
        if not _LABEL.match(namespace or "") or not _NAME.match(name or ""):
            raise ClaimError(f"claim {namespace!r}/{name!r}: not a valid namespace and name")
        label = f"claim {namespace}/{name}"
        try:
            claim = await asyncio.wait_for(self.get_claim(namespace, name, uid), self.cfg.api_timeout_s)
        except TimeoutError:
            raise ClaimError(f"{label}: reading it from the API timed out after {self.cfg.api_timeout_s:.0f}s") \
                from None
        except Exception as e:  # noqa: BLE001 - an API failure is this claim's error, retried by the kubelet
            raise ClaimError(f"{label}: reading it from the API failed: {_short(e)}") from None
        if claim is None:
            raise ClaimError(f"{label} (UID {uid}) not found in the API")
        mig = mig_results_of(claim, self.cfg.driver_name, self.cfg.node_name)
        if mig:
            await self._require_pod_here(label, namespace, claim)
            return await self.prepare_mig(claim, namespace, name, uid, mig)
        grant = grant_from_claim(claim, namespace=namespace, name=name, uid=uid, driver=self.cfg.driver_name,
                                 pool=self.cfg.node_name, inventory=self.state.inventory)
        check_enforceable(grant, self.state.inventory, self.cfg.memory_unit_mib)
        await self._require_pod_here(label, namespace, claim)
        # shielded: a cancelled call (the kubelet's deadline) never stops between the commit and the edits;
        # the prepare finishes (or rolls back) on its own, and the kubelet's retry finds it done
        task = asyncio.ensure_future(self._locked_prepare(grant))
        self._running.add(task)
        task.add_done_callback(_forget_task(self._running))
        return await asyncio.shield(task)

    async def _require_pod_here(self, label: str, namespace: str, claim: dict[str, Any]) -> None:
        """Refuse a claim reserved only for pods bound to other nodes (placement.py)."""
        pods = reserved_pods(label, claim)
        if pods:  # a claim reserved for no pod is refused by the checks of its kind
            await require_pod_here(label, namespace, pods, self.cfg.node_name, self.cached_pod, self.get_pod,
                                   self.cfg.api_timeout_s)

    async def prepare_mig(self, claim: dict[str, Any], namespace: str, name: str, uid: str,
                          results: list[MigResult]) -> list[PreparedDevice]:
        """A claim of MIG devices: the instance made at the allocated placement (MigClaims), under the claim's lock."""
        if self.mig is None:
            raise ClaimError(f"claim {namespace}/{name}: names MIG devices, but this node serves no MIG")
        mig = self.mig
        reserved = reserved_pods(f"claim {namespace}/{name}", claim)
        if not reserved:
            raise ClaimError(f"claim {namespace}/{name} is not reserved for any pod (status.reservedFor is empty)")
        pod, pod_uid, pods = reserved[0].name, reserved[0].uid, len(reserved)

        async def run() -> list[PreparedDevice]:
            async with self._locks.hold(uid):
                names = await mig.prepare(namespace, name, uid, pod, pod_uid, results, pods)
            return [PreparedDevice(requests=(r.request,), pool=self.cfg.node_name, device=r.device, cdi_ids=(n,))
                    for r, n in zip(results, names, strict=True)]

        task = asyncio.ensure_future(run())  # shielded, as for any claim: the kubelet's deadline never cuts it
        self._running.add(task)
        task.add_done_callback(_forget_task(self._running))
        return await asyncio.shield(task)

    async def _locked_prepare(self, grant: ClaimGrant) -> list[PreparedDevice]:
        async with self._locks.hold(grant.uid):
            return await self._prepare(grant)

    async def _prepare(self, grant: ClaimGrant, check_health: bool = True) -> list[PreparedDevice]:
        label = f"claim {grant.namespace}/{grant.name}"
        wanted = self.allocations(grant)
        held = [self.state.ledger.allocations[k] for k in claim_keys(self.state.ledger, grant.uid)]
        created = False
        if held:
            if [(a.key, a.cards, a.cores, a.memory_mib) for a in held] != \
                    [(a.key, a.cards, a.cores, a.memory_mib) for a in wanted]:
                raise ClaimError(f"{label} (UID {grant.uid}) is already prepared with other devices "
                                 f"({_devices(held)}; the claim now names {_devices(wanted)}); unprepare it first")
        else:
            def take(ledger: Ledger) -> None:
                for a in wanted:
                    ledger.assign(a, check_health=check_health)

            try:
                await self.state.commit(take)
            except LedgerError as e:
                raise ClaimError(f"{label} does not fit on node {self.cfg.node_name}: {e} (the scheduler "
                                 "over-committed the device; nothing was prepared)") from None
            except OSError as e:
                raise ClaimError(f"{label}: the checkpoint could not be written: {e}") from None
            created = True
        try:
            devices = await self._materialise(grant, fresh=created)
        except BaseException as e:
            if created:  # only what this call made is undone: a claim held before stays as it was
                await self._release(grant.uid)
            if not isinstance(e, Exception):
                raise
            raise ClaimError(f"{label}: preparing the container edits failed: {_short(e)}") from None
        if created:
            log.info("%s (UID %s) prepared for pod %s: %s", label, grant.uid, grant.pods[0].uid,
                     ", ".join(f"{d.device} {d.cores} cores {d.memory_bytes // MIB} MiB" for d in grant.devices))
        return devices

    def allocations(self, grant: ClaimGrant) -> list[Allocation]:
        out = []
        pod = grant.pods[0]
        for n, d in enumerate(grant.devices):
            holder = ClaimHolder(uid=grant.uid, namespace=grant.namespace, name=grant.name, pod=pod.name,
                                 pod_uid=pod.uid, request=d.request, device=d.device, share_id=d.share_id)
            out.append(Allocation(key=f"{LEDGER_PREFIX}{grant.uid}/{n}", cards=(d.index,), cores=d.cores,
                                  memory_mib=d.memory_mib, holder=holder, verified=True))
        return out

    def limits(self, grant: ClaimGrant) -> Limits:
        """One entry per card (a card granted to two requests: the amounts summed). A grant of the card's whole
        memory (rounded down to the request step) has no memory limit."""
        inv = self.state.inventory
        cards = per_card(grant)
        fractional = [c.cores for c in cards if c.cores < CORES]  # one share (prepare refuses mixed ones)
        devices = tuple(
            DeviceLimit(uuid=inv.gpus[c.index].uuid, index=c.index,
                        memory_limit_bytes=c.memory_bytes
                        if c.memory_bytes < memory_ceiling(inv.gpus[c.index].memory_mib, self.cfg.memory_unit_mib)
                        else 0)
            for c in cards)
        name = grant.name if _LABEL.match(grant.name) else "claim"
        return with_compute(inv, Limits(pod_uid=grant.pods[0].uid, container_name=name,
                                        core_limit=max(fractional, default=0), hard_limit=True, core_ceiling=0,
                                        devices=devices), mig=False)

    async def _materialise(self, grant: ClaimGrant, fresh: bool) -> list[PreparedDevice]:
        """The vDevice directory, server and CDI spec. On failure, `fresh` (this call took the claim): undo
        them; else (a repeat for a held claim, maybe running) leave them: the spec is replaced atomically, so a
        failed write keeps the previous one, and the directory a container mounts must never be recreated."""
        inv = self.state.inventory
        key = vdevice_key(grant.uid)
        limits = self.limits(grant)
        cards = per_card(grant)
        limited = bool(limits.core_limit) or any(d.memory_limit_bytes for d in limits.devices)
        ctl = await self.state.run_io(cdi.ctl_devices, self.cfg.dev_root)
        spec = cdi.build_spec(
            claim_uid=grant.uid,
            gpus=[(c.index, inv.gpus[c.index].minor, inv.gpus[c.index].uuid) for c in cards],
            ctl_devices=ctl, driver_dir=self.cfg.driver_dir, shim_dir=self.cfg.shim_dir,
            vdevice_dir=self.layout.dir_for(key), limited=limited, shim_log_level=self.cfg.shim_log_level,
            annotations={})
        # the vDevice server and the CDI spec are independent: make both at once
        started, written = await asyncio.gather(start_server(self.vdevices, inv, key, limits, (c.index for c in cards)),
                                                self.state.run_io(self.cdi.write, grant.uid, spec),
                                                return_exceptions=True)
        for outcome in (started, written):
            if isinstance(outcome, BaseException):
                if fresh:
                    await self.vdevices.stop(key)
                    await self.state.run_io(self.cdi.remove, grant.uid)
                raise outcome
        by_device: dict[str, PreparedDevice] = {}
        for d in grant.devices:
            name = cdi.qualified(cdi.device_name(grant.uid, d.index))
            got = by_device.get(d.device)
            if got is None:
                by_device[d.device] = PreparedDevice(requests=(d.request,), pool=self.cfg.node_name,
                                                     device=d.device, cdi_ids=(name,))
            elif d.request not in got.requests:
                by_device[d.device] = PreparedDevice(requests=got.requests + (d.request,), pool=got.pool,
                                                     device=got.device, cdi_ids=got.cdi_ids)
        return list(by_device.values())

    # -- unprepare ------------------------------------------------------------------------------------------
    async def unprepare(self, uid: str) -> bool:
        """Free the claim: CDI spec, vDevice server and directory, ledger. True when anything was held."""
        check_uid(uid)
        if self.mig is not None and any(self.state.ledger.allocations[k].mig for k in claim_keys(self.state.ledger,
                                                                                                 uid)):
            async with self._locks.hold(uid):
                freed = await self.mig.unprepare(uid)
            log.info("claim UID %s unprepared: %d MIG holdings released", uid, freed)
            return True
        async with self._locks.hold(uid):
            had_spec = await self.state.run_io(self.cdi.remove, uid)
            await self.vdevices.stop(vdevice_key(uid))
            released = await self._release(uid)
        if released or had_spec:
            log.info("claim UID %s unprepared: %d ledger entries freed", uid, released)
        return bool(released or had_spec)

    async def _release(self, uid: str) -> int:
        def give_back(ledger: Ledger) -> int:
            keys = claim_keys(ledger, uid)
            for k in keys:
                ledger.release(k)
            return len(keys)

        if not claim_keys(self.state.ledger, uid):
            return 0
        return await self.state.commit(give_back)

    # -- recovery -------------------------------------------------------------------------------------------
    async def restore(self, grant: ClaimGrant) -> None:
        """After a restart: hold what a prepared claim holds (even on a card that turned sick since) and bring
        its vDevice server and CDI spec back."""
        async with self._locks.hold(grant.uid):
            await self._prepare(grant, check_health=False)


def _devices(allocs: list[Allocation]) -> str:
    """`gpu-6 (30 cores, 4096 MiB), gpu-7 (whole card)`: the devices as the claim's results name them."""
    out = []
    for a in allocs:
        name = a.holder.device if isinstance(a.holder, ClaimHolder) and a.holder.device else \
            ", ".join(device_name(c) for c in a.cards)
        out.append(f"{name} ({'whole card' if a.cores >= CORES else f'{a.cores} cores, {a.memory_mib} MiB'})")
    return ", ".join(out)


def _forget_task(running: set[asyncio.Task[list[PreparedDevice]]]) \
        -> Callable[[asyncio.Task[list[PreparedDevice]]], None]:
    def done(task: asyncio.Task[list[PreparedDevice]]) -> None:
        running.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a prepare whose caller left logs nothing spurious

    return done


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "…"


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
