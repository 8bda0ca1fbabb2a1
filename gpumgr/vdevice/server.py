"""The vDevice gRPC service: one small server per GPU container, on `<root>/<key>/vcuda.sock`.

The socket a call arrives on says which container calls (each container mounts only its own directory), so
the request may be empty. Fields that are sent must agree with that container, or the call is refused with
PERMISSION_DENIED and nothing is answered: another pod's UID or container name, bus ids of cards the
container does not hold, or a container ID the calling process is not in. A malformed container ID is
INVALID_ARGUMENT. All servers of a pod stop together when the pod is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import grpc

from gpumgr.pb import vdevice_pb2 as pb
from gpumgr.pb import vdevice_pb2_grpc as pb_grpc
from gpumgr.vdevice.layout import BadName, VDeviceLayout, check_container_id
from gpumgr.vdevice.limits import Limits
from gpumgr.vdevice.peers import host_pid

log = logging.getLogger("gpumgr.vdevice")


class _Servicer(pb_grpc.VDeviceServicer):
    def __init__(self, key: str, limits: Limits, bus_ids: frozenset[str], proc_root: Path,
                 on_register: Callable[[str, Limits], None], io: Executor):
        self.io = io
        self.key = key
        self.limits = limits
        self.bus_ids = bus_ids
        self.proc_root = proc_root
        self.on_register = on_register

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.RegisterResponse:  # noqa: N802
        lim = self.limits
        if request.pod_uid and request.pod_uid != lim.pod_uid:
            log.warning("vDevice %s: Register names pod %s, socket belongs to pod %s: denied",
                        self.key, request.pod_uid, lim.pod_uid)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"this socket serves pod {lim.pod_uid}, not {request.pod_uid}")
        if request.container_name and request.container_name != lim.container_name:
            log.warning("vDevice %s: Register names container %s, socket belongs to %s/%s: denied",
                        self.key, request.container_name, lim.pod_uid, lim.container_name)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"this socket serves container {lim.container_name}, not {request.container_name}")
        if request.container_id:
            try:
                check_container_id(request.container_id)
            except BadName as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        foreign = [b for b in request.bus_ids if b.upper() not in self.bus_ids and _short(b) not in self.bus_ids]
        if foreign:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"bus ids {foreign} are not cards of container {lim.container_name}")
        hpid = 0
        if request.pid > 0:  # a walk of /proc: off the event loop
            hpid = await asyncio.get_running_loop().run_in_executor(self.io, host_pid, self.proc_root,
                                                                     int(request.pid), lim.pod_uid)
        if hpid and request.container_id and not _in_container(self.proc_root, hpid, request.container_id):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"process {request.pid} is not in container {request.container_id}")
        self.on_register(self.key, lim)
        log.info("vDevice registration: pod %s container %s pid %d (host %d)", lim.pod_uid, lim.container_name,
                 request.pid, hpid)
        return pb.RegisterResponse(
            devices=[pb.DeviceLimit(uuid=d.uuid, index=d.index, memory_limit_bytes=d.memory_limit_bytes)
                     for d in lim.devices],
            core_limit=lim.core_limit, hard_limit=lim.hard_limit, core_ceiling=lim.core_ceiling, host_pid=hpid,
        )


def _short(bus: str) -> str:
    """`00000000:07:00.0` and `0000:07:00.0` name the same card: compare on bus:device.function."""
    return ":".join(bus.upper().split(":")[-2:])


def _in_container(proc_root: Path, pid: int, container_id: str) -> bool:
    cid = container_id.split("://")[-1]
    try:
        return cid in (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return False


class VDeviceManager:
    """Starts and stops the per-container servers; `registrations` counts successful Register calls."""

    def __init__(self, layout: VDeviceLayout, proc_root: Path = Path("/proc"),
                 on_register: Callable[[], None] | None = None):
        self.layout = layout
        self.proc_root = proc_root
        self.on_register = on_register
        self._servers: dict[str, tuple[grpc.aio.Server, Limits]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vdevice")
        self.registrations = 0

    def _count(self, key: str, limits: Limits) -> None:
        self.registrations += 1
        if self.on_register is not None:
            self.on_register()

    def running(self) -> dict[str, Limits]:
        return {k: lim for k, (_, lim) in self._servers.items()}

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def start(self, key: str, limits: Limits, bus_ids: frozenset[str] = frozenset()) -> None:
        """Write the limits file and serve the socket (replacing a server with other limits). `bus_ids`: the
        PCI bus ids of the container's cards (a Register naming others is refused). One key at a time."""
        async with self._lock(key):
            await self._start(key, limits, bus_ids)

    async def _start(self, key: str, limits: Limits, bus_ids: frozenset[str]) -> None:
        current = self._servers.get(key)
        await asyncio.get_running_loop().run_in_executor(self._io, self.layout.write_limits, key, limits)
        if current and current[1] == limits:
            return
        if current:
            await self._stop(key, remove_dir=False)
        sock = self.layout.socket_for(key)
        if len(str(sock)) >= 108:
            raise ValueError(f"socket path {sock} is longer than a unix socket allows (107 bytes)")
        sock.unlink(missing_ok=True)
        server = grpc.aio.server()
        allowed = frozenset({b.upper() for b in bus_ids} | {_short(b) for b in bus_ids})
        pb_grpc.add_VDeviceServicer_to_server(
            _Servicer(key, limits, allowed, self.proc_root, self._count, self._io), server)
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        os.chmod(sock, 0o666)
        self._servers[key] = (server, limits)
        log.info("vDevice server up for pod %s container %s at %s", limits.pod_uid, limits.container_name, sock)

    async def stop(self, key: str, remove_dir: bool = True) -> None:
        async with self._lock(key):
            await self._stop(key, remove_dir)
        if key not in self._servers:
            self._locks.pop(key, None)

    async def _stop(self, key: str, remove_dir: bool) -> None:
        entry = self._servers.pop(key, None)
        if entry:
            await entry[0].stop(grace=0.2)
        if remove_dir:
            self.layout.remove(key)

    async def stop_all(self) -> None:
        for k in list(self._servers):
            await self.stop(k, remove_dir=False)
        self._io.shutdown(wait=False)
