"""The kubelet's DRA side, over real unix sockets: plugin discovery in the plugins registry directory
(GetInfo, NotifyRegistrationStatus), NodePrepareResources before a pod's containers start, the returned CDI
names resolved from the CDI directory into each container's devices, mounts and env, and NodeUnprepareResources
once no pod on the node uses a claim. Claims and pods are read from the test API server's store.

    kubelet = DraKubelet(registry_dir, [cdi_dir], api.store, "node-1")
    await kubelet.start(); await kubelet.wait_driver("vgpu.gpumgr.io")
    running = await kubelet.run_pod("default", "train")     # RunningDraPod: edits per container
    await kubelet.delete_pod("default", "train")
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpumgr.pb import dra_pb2 as pb
from gpumgr.pb import dra_pb2_grpc as pb_grpc
from gpumgr.pb import pluginregistration_pb2 as rpb
from gpumgr.pb import pluginregistration_pb2_grpc as rpb_grpc
from gpumgr.sim.kubeapi import KubeStore
from gpumgr.sim.kubelet.dra_cdi import ContainerEdits, resolve

log = logging.getLogger(__name__)
SERVICE = "v1.DRAPlugin"
RPC_TIMEOUT_S = 30.0


class DraPrepareError(Exception):
    """NodePrepareResources failed for one or more claims of a pod: `errors` maps claim name -> message."""

    def __init__(self, errors: Mapping[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = dict(errors)


class DraKubelet:
    def __init__(self, registry_dir: Path, cdi_dirs: Sequence[Path], store: KubeStore, node_name: str):
        self.registry_dir = Path(registry_dir)
        self.cdi_dirs = [Path(d) for d in cdi_dirs]
        self.store = store
        self.node_name = node_name
        self.drivers: dict[str, DriverConnection] = {}
        self.running: dict[tuple[str, str], RunningDraPod] = {}
        self.registrations = 0
        self._watch: asyncio.Task[None] | None = None
        self._seen: set[tuple[Path, int, int]] = set()

    # -- plugin discovery -----------------------------------------------------------------------------------
    async def start(self, poll_s: float = 0.1) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._watch = asyncio.create_task(self._discover(poll_s))

    async def stop(self) -> None:
        """A kubelet going away: connections close; plugins stay registered nowhere until the next start."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for conn in self.drivers.values():
            await conn.channel.close()
        self.drivers.clear()
        self._seen.clear()

    async def _discover(self, poll_s: float) -> None:
        while True:
            socks = set()
            try:
                for p in self.registry_dir.iterdir():
                    with contextlib.suppress(OSError):
                        st = p.lstat()
                        if stat.S_ISSOCK(st.st_mode):
                            socks.add((p, st.st_ino, st.st_mtime_ns))  # a socket made again is new (fsnotify)
            except OSError:
                pass
            for entry in sorted(socks - self._seen):
                self._seen.add(entry)
                sock = entry[0]
                try:
                    await self._register(sock)
                except Exception as e:  # noqa: BLE001 - a broken plugin must not stop discovery
                    log.warning("DRA plugin at %s: registration failed: %s", sock, e)
            self._seen &= socks
            await asyncio.sleep(poll_s)

    async def _register(self, sock: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
            stub = rpb_grpc.RegistrationStub(ch)
            info = await stub.GetInfo(rpb.InfoRequest(), timeout=RPC_TIMEOUT_S)
            error = ""
            if info.type != "DRAPlugin":
                error = f"plugin type {info.type!r} is not DRAPlugin"
            elif SERVICE not in info.supported_versions:
                error = f"none of {list(info.supported_versions)} is a supported DRA service ({SERVICE})"
            elif not Path(info.endpoint).is_absolute():
                error = f"endpoint {info.endpoint!r} is not an absolute path"
            if not error:
                old = self.drivers.pop(info.name, None)
                if old is not None:
                    await old.channel.close()
                channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
                self.drivers[info.name] = DriverConnection(info.name, info.endpoint, channel,
                                                           pb_grpc.DRAPluginStub(channel))
                self.registrations += 1
            await stub.NotifyRegistrationStatus(rpb.RegistrationStatus(plugin_registered=not error, error=error),
                                                timeout=RPC_TIMEOUT_S)
            if error:
                log.warning("DRA plugin at %s refused: %s", sock, error)

    async def wait_driver(self, name: str, timeout: float = 10.0, after: int = 0) -> None:
        """Until driver `name` is registered (and the registration count passed `after`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while name not in self.drivers or self.registrations <= after:
            if loop.time() > deadline:
                raise TimeoutError(f"DRA driver {name} did not register within {timeout}s")
            await asyncio.sleep(0.05)

    # -- pods ------------------------------------------------------------------------------------------------
    def _claims_of(self, pod: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        ns = pod["metadata"].get("namespace") or "default"
        statuses = {s.get("name"): s.get("resourceClaimName")
                    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        out = {}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            if not name:
                raise DraPrepareError({ref.get("name", "?"): "the claim of this pod has not been created yet"})
            claim = self.store.get_object("resourceclaims", name, ns)
            if claim is None:
                raise DraPrepareError({name: "ResourceClaim not found"})
            out[ref["name"]] = claim
        return out

    async def prepare(self, driver: str, claims: Sequence[tuple[str, str, str]]) \
            -> pb.NodePrepareResourcesResponse:
        """One NodePrepareResources call: claims as (namespace, name, uid)."""
        conn = self.drivers.get(driver)
        if conn is None:
            raise DraPrepareError({c[1]: f"DRA driver {driver} is not registered" for c in claims})
        req = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace=n, name=m, uid=u) for n, m, u in claims])
        resp: pb.NodePrepareResourcesResponse = await conn.stub.NodePrepareResources(req, timeout=RPC_TIMEOUT_S)
        return resp

    async def unprepare(self, driver: str, claims: Sequence[tuple[str, str, str]]) \
            -> pb.NodeUnprepareResourcesResponse:
        conn = self.drivers.get(driver)
        if conn is None:
            raise DraPrepareError({c[1]: f"DRA driver {driver} is not registered" for c in claims})
        req = pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace=n, name=m, uid=u) for n, m, u in claims])
        resp: pb.NodeUnprepareResourcesResponse = await conn.stub.NodeUnprepareResources(req, timeout=RPC_TIMEOUT_S)
        return resp

    async def run_pod(self, namespace: str, name: str) -> RunningDraPod:
        """Prepare every claim of a pod bound to this node and work out each container's edits."""
        pod = self.store.get_pod(namespace, name)
        if pod is None:
            raise DraPrepareError({name: "pod not found"})
        if (pod.get("spec") or {}).get("nodeName") != self.node_name:
            raise DraPrepareError({name: f"pod is not bound to node {self.node_name}"})
        claims = self._claims_of(pod)
        by_driver: dict[str, list[tuple[str, str, str]]] = {}
        for claim in claims.values():
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
            meta = claim["metadata"]
            for drv in sorted({r["driver"] for r in results}):
                by_driver.setdefault(drv, []).append((namespace, meta["name"], meta["uid"]))
        prepared: dict[str, list[pb.Device]] = {}
        errors: dict[str, str] = {}
        # as the kubelet does: a claim already prepared here (another running pod uses it) is not prepared again;
        # the new pod is only added to the claim's users
        mine = {c["metadata"]["uid"] for c in claims.values()}
        for other in self.running.values():
            for _, uid in other.claims.values():
                if uid in mine and uid in other.devices and uid not in prepared:
                    prepared[uid] = list(other.devices[uid])
        by_driver = {drv: [e for e in entries if e[2] not in prepared] for drv, entries in by_driver.items()}
        by_driver = {drv: entries for drv, entries in by_driver.items() if entries}
        for drv, entries in by_driver.items():
            try:
                resp = await self.prepare(drv, entries)
            except grpc.aio.AioRpcError as e:
                errors.update({n: f"{e.code().name}: {e.details()}" for _, n, _ in entries})
                continue
            for _, cname, uid in entries:
                got = resp.claims.get(uid)
                if got is None:
                    errors[cname] = "missing from the driver's answer"
                elif got.error:
                    errors[cname] = got.error
                else:
                    prepared.setdefault(uid, []).extend(got.devices)
        if errors:
            raise DraPrepareError(errors)
        containers: dict[str, ContainerEdits] = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            ids: list[str] = []
            for ref in ((c.get("resources") or {}).get("claims") or []):
                used = claims.get(ref.get("name"))
                if used is None:
                    continue
                for d in prepared.get(used["metadata"]["uid"], []):
                    if ref.get("request") and ref["request"] not in d.request_names:
                        continue
                    ids.extend(i for i in d.cdi_device_ids if i not in ids)
            containers[c["name"]] = resolve(ids, self.cdi_dirs) if ids else ContainerEdits()
        running = RunningDraPod(namespace=namespace, name=name, uid=pod["metadata"]["uid"],
                                claims={k: (v["metadata"]["name"], v["metadata"]["uid"]) for k, v in claims.items()},
                                containers=containers, devices=prepared)
        self.running[(namespace, name)] = running
        return running

    async def delete_pod(self, namespace: str, name: str) -> dict[str, str]:
        """The pod stops: unprepare the claims no other running pod here uses. Returns claim name -> error."""
        running = self.running.pop((namespace, name), None)
        if running is None:
            return {}
        still = {uid for p in self.running.values() for _, uid in p.claims.values()}
        errors: dict[str, str] = {}
        for cname, uid in running.claims.values():
            if uid in still:
                continue
            stored = self.store.get_object("resourceclaims", cname, namespace)
            results = (((stored or {}).get("status") or {}).get("allocation") or {}).get("devices", {}) \
                .get("results") or []
            drivers = {r["driver"] for r in results} or set(self.drivers)
            for drv in sorted(drivers):
                if drv not in self.drivers:
                    continue
                resp = await self.unprepare(drv, [(namespace, cname, uid)])
                if resp.claims[uid].error:
                    errors[cname] = resp.claims[uid].error
        return errors


@dataclass
class DriverConnection:
    name: str
    endpoint: str
    channel: grpc.aio.Channel
    stub: pb_grpc.DRAPluginStub


@dataclass
class RunningDraPod:
    namespace: str
    name: str
    uid: str
    claims: dict[str, tuple[str, str]]  # pod claim name -> (ResourceClaim name, uid)
    containers: dict[str, ContainerEdits] = field(default_factory=dict)
    devices: dict[str, list[pb.Device]] = field(default_factory=dict)  # claim uid -> prepared devices
