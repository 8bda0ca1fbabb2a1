"""The vDevice gRPC service: one small server per GPU container, on `<root>/<key>/vcuda.sock`.

The socket a call arrives on says which container calls (each container mounts only its own directory), so
the request may be empty. Fields that are sent must agree with that container, or the call is refused with
PERMISSION_DENIED and nothing is answered: another pod's UID or container name, bus ids of cards the
container does not hold, or a container ID the calling process is not in. A malformed container ID is
INVALID_ARGUMENT. All servers of a pod stop together when the pod is gone.

One container's Register traffic cannot hold up another container or admission (docs/vdevice.md, "Limits"):
each socket serves at most MAX_CONCURRENT_RPCS calls at once and has at most MAX_PENDING_LOOKUPS host-PID
lookups in flight, one walking /proc at a time, with its answers cached; more is RESOURCE_EXHAUSTED (the shim
retries). Walks run on their own threads, and the limits files that PreStartContainer writes on another, so
admission never queues behind a container's Register calls.
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
from gpumgr.vdevice.peers import host_pid, in_container

log = logging.getLogger("gpumgr.vdevice")

MAX_CONCURRENT_RPCS = 16  # per socket; gRPC answers RESOURCE_EXHAUSTED beyond it
MAX_PENDING_LOOKUPS = 8  # per socket: host-PID lookups running or waiting
CACHED_PIDS = 64  # per socket: (namespace PID -> host PID) answers kept
WALK_THREADS = 4  # /proc walks of all sockets together; one socket uses at most one
MAX_MESSAGE_BYTES = 64 * 1024  # a Register request is a few hundred bytes
MAX_FIELD = 256  # characters of pod_uid, container_name, container_id, one bus id
MAX_BUS_IDS = 64


class _Servicer(pb_grpc.VDeviceServicer):
    def __init__(self, key: str, limits: Limits, bus_ids: frozenset[str], proc_root: Path,
                 on_register: Callable[[str, Limits], None], walks: Executor):
        self.walks = walks
        self.key = key
        self.limits = limits
        self.bus_ids = bus_ids
        self.proc_root = proc_root
        self.on_register = on_register
        self._walking = asyncio.Lock()  # one /proc walk per socket at a time
        self._pending = 0
        self._refused = 0  # refusals since the last lookup that ran
        self._known: dict[int, int] = {}  # namespace PID -> host PID, newest last

    def _lookup(self, ns_pid: int, container_id: str) -> asyncio.Future[tuple[int, bool]] | None:
        """(host PID, in `container_id`) for the caller, or None when this socket has too many lookups. The
        lookup is a task of its own: a caller that gives up (deadline, cancel) does not free the socket's walk
        slot while its walk still runs, so abandoned calls cannot pile walks onto the shared threads."""
        if self._pending >= MAX_PENDING_LOOKUPS:
            return None
        self._pending += 1
        task = asyncio.ensure_future(self._walk(ns_pid, container_id))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "exception was never retrieved"
        return task

    async def _walk(self, ns_pid: int, container_id: str) -> tuple[int, bool]:
        try:
            async with self._walking:
                known = self._known.pop(ns_pid, 0)
                hpid, inside = await asyncio.get_running_loop().run_in_executor(
                    self.walks, _find, self.proc_root, ns_pid, self.limits.pod_uid, known, container_id)
                if self._refused:
                    log.info("vDevice %s: %d Register calls were refused while %d were in flight", self.key,
                             self._refused, MAX_PENDING_LOOKUPS)
                    self._refused = 0
                if hpid:
                    self._known[ns_pid] = hpid
                    while len(self._known) > CACHED_PIDS:
                        del self._known[next(iter(self._known))]
                return hpid, inside
        finally:
            self._pending -= 1

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.RegisterResponse:  # noqa: N802
        lim = self.limits
        too_big = _oversized(request)
        if too_big:
            log.warning("vDevice %s: Register with %s: refused", self.key, too_big)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, too_big)
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
                                f"bus ids {foreign[:4]}{' ...' if len(foreign) > 4 else ''} are not cards of "
                                f"container {lim.container_name}")
        hpid, inside = 0, True
        if request.pid > 0:  # a walk of /proc (or a cached answer re-checked): off the event loop, bounded
            lookup = self._lookup(int(request.pid), request.container_id)
            if lookup is None:
                self._refused += 1
                if self._refused == 1:  # one line per burst, not one per refused call
                    log.warning("vDevice %s: pod %s container %s has %d Register calls in flight: refusing more",
                                self.key, lim.pod_uid, lim.container_name, MAX_PENDING_LOOKUPS)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"too many Register calls in flight on this socket (at most "
                                    f"{MAX_PENDING_LOOKUPS}); retry")
                return pb.RegisterResponse()  # not reached: abort raises
            hpid, inside = await asyncio.shield(lookup)
        if hpid and request.container_id and not inside:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"process {request.pid} is not in container {request.container_id}")
        self.on_register(self.key, lim)
        log.info("vDevice registration: pod %s container %s pid %d (host %d)", lim.pod_uid, lim.container_name,
                 request.pid, hpid)
        return pb.RegisterResponse(
            devices=[pb.DeviceLimit(uuid=d.uuid, index=d.index, memory_limit_bytes=d.memory_limit_bytes,
                                    compute=d.compute) for d in lim.devices],
            core_limit=lim.core_limit, hard_limit=lim.hard_limit, core_ceiling=lim.core_ceiling, host_pid=hpid,
        )


def _oversized(request: pb.RegisterRequest) -> str | None:
    """What in a request is larger than any real caller sends (nothing of it is echoed), or None."""
    for name, value, most in (("pod_uid", request.pod_uid, MAX_FIELD), ("container_name", request.container_name,
                              MAX_FIELD), ("container_id", request.container_id, MAX_FIELD)):
        if len(value) > most:
            return f"{name} longer than {most} characters"
    if len(request.bus_ids) > MAX_BUS_IDS or any(len(b) > MAX_FIELD for b in request.bus_ids):
        return f"more than {MAX_BUS_IDS} bus ids, or one longer than {MAX_FIELD} characters"
    return None


def _short(bus: str) -> str:
    """`00000000:07:00.0` and `0000:07:00.0` name the same card: compare on bus:device.function."""
    return ":".join(bus.upper().split(":")[-2:])


def _find(proc_root: Path, ns_pid: int, pod_uid: str, known: int, container_id: str) -> tuple[int, bool]:
    """On a walk thread: the host PID, and whether it is in `container_id` (True when none is named)."""
    hpid = host_pid(proc_root, ns_pid, pod_uid, known)
    return hpid, not (hpid and container_id) or in_container(proc_root, hpid, container_id)


class VDeviceManager:
    """Starts and stops the per-container servers; `registrations` counts successful Register calls."""

    def __init__(self, layout: VDeviceLayout, proc_root: Path = Path("/proc"),
                 on_register: Callable[[], None] | None = None):
        self.layout = layout
        self.proc_root = proc_root
        self.on_register = on_register
        self._servers: dict[str, tuple[grpc.aio.Server, Limits]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # limits files (PreStartContainer, reconcile) and /proc walks (Register) never share a thread
        self._files = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vdevice-files")
        self._walks = ThreadPoolExecutor(max_workers=WALK_THREADS, thread_name_prefix="vdevice-proc")
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
        await asyncio.get_running_loop().run_in_executor(self._files, self.layout.write_limits, key, limits)
        if current and current[1] == limits:
            return
        if current:
            await self._stop(key, remove_dir=False)
        sock = self.layout.socket_for(key)
        if len(str(sock)) >= 108:
            raise ValueError(f"socket path {sock} is longer than a unix socket allows (107 bytes)")
        sock.unlink(missing_ok=True)
        server = grpc.aio.server(maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
                                 options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        allowed = frozenset({b.upper() for b in bus_ids} | {_short(b) for b in bus_ids})
        pb_grpc.add_VDeviceServicer_to_server(
            _Servicer(key, limits, allowed, self.proc_root, self._count, self._walks), server)
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
        self._files.shutdown(wait=False)
        self._walks.shutdown(wait=False)
