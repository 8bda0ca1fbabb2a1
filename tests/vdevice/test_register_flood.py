"""One container's Register traffic never holds up another container or admission (tracker issue 9, item 9).

Real unix-socket gRPC to real vDevice servers. The host's /proc is a directory tree laid out like /proc: the
flooding container's process has a `cgroup` file that is a FIFO, so every /proc walk made for that container
blocks until the test lets it go. Nothing here measures time: the test checks what completes while the flood
is held, and that every flooded call ends with an answer or a clear RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpumgr.pb import vdevice_pb2 as pb
from gpumgr.pb import vdevice_pb2_grpc as pb_grpc
from gpumgr.vdevice.layout import VDeviceLayout, allocation_key
from gpumgr.vdevice.limits import DeviceLimit, Limits
from gpumgr.vdevice.server import VDeviceManager

UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
UID_C = "cccccccc-0000-4000-8000-000000000003"
FLOOD = 32


def limits(uid: str) -> Limits:
    return Limits(pod_uid=uid, container_name="main", core_limit=30, hard_limit=True, core_ceiling=0,
                  devices=(DeviceLimit(uuid="GPU-0", index=0, memory_limit_bytes=1 << 30),))


def process(proc: Path, host_pid: int, ns_pid: int, uid: str | None) -> Path:
    d = proc / str(host_pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nPid:\t{host_pid}\nNSpid:\t{host_pid}\t{ns_pid}\n")
    if uid is not None:
        (d / "cgroup").write_text(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-x.scope\n")
    return d


@pytest.fixture
def root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="vdf", dir="/tmp"))  # unix socket paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def register(sock: Path, pid: int, deadline_s: float = 60) -> pb.RegisterResponse | grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        try:
            return await pb_grpc.VDeviceStub(ch).Register(pb.RegisterRequest(pid=pid), timeout=deadline_s)
        except grpc.aio.AioRpcError as e:
            return e.code()


async def reader_waiting(fifo: Path) -> int:
    """Open the FIFO's write end once a /proc walk is reading it; the reader then blocks until we write."""
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        await asyncio.sleep(0.01)


async def test_a_register_flood_does_not_hold_up_other_containers_or_limit_writes(root: Path):
    proc = root / "proc"
    held = process(proc, 1007, 7, None)  # the flooding container's process: its cgroup read blocks
    fifo = held / "cgroup"
    os.mkfifo(fifo)
    process(proc, 1009, 9, UID_B)
    for other in range(2000, 2040):  # the rest of the host
        process(proc, other, other, "ffffffff-0000-4000-8000-00000000000f")
    layout = VDeviceLayout(root / "vm")
    mgr = VDeviceManager(layout, proc)
    ka, kb, kc = (allocation_key([u]) for u in (UID_A, UID_B, UID_C))
    await mgr.start(ka, limits(UID_A))
    await mgr.start(kb, limits(UID_B))
    wfd = -1
    flood: list[asyncio.Task[pb.RegisterResponse | grpc.StatusCode]] = []
    try:
        flood = [asyncio.create_task(register(layout.socket_for(ka), 7)) for _ in range(FLOOD)]
        wfd = await asyncio.wait_for(reader_waiting(fifo), 60)  # the flood is inside a /proc walk, held there

        # another container registers and learns its host PID while the flood is held
        answer = await asyncio.wait_for(register(layout.socket_for(kb), 9), 60)
        assert isinstance(answer, pb.RegisterResponse), answer
        assert answer.host_pid == 1009 and answer.core_limit == 30
        # admission: PreStart writes a new container's limits and starts its server while the flood is held
        await asyncio.wait_for(mgr.start(kc, limits(UID_C)), 60)
        assert (layout.dir_for(kc) / "limits").read_text() == limits(UID_C).to_text()
        answer = await asyncio.wait_for(register(layout.socket_for(kc), 0), 60)
        assert isinstance(answer, pb.RegisterResponse) and answer.core_limit == 30
        assert not all(t.done() for t in flood)  # all of that happened with the flood still held

        # let the flood go: the blocked read gets the pod's cgroup; later walks read a plain file
        plain = held / "cgroup.plain"
        plain.write_text(f"0::/kubepods/pod{UID_A}/cri-x\n")
        os.replace(plain, fifo)
        os.write(wfd, f"0::/kubepods/pod{UID_A}/cri-x\n".encode())
        os.close(wfd)
        wfd = -1
        results = await asyncio.wait_for(asyncio.gather(*flood), 120)
    finally:
        if wfd >= 0:
            with contextlib.suppress(OSError):
                os.write(wfd, b"x\n")
            os.close(wfd)
        with contextlib.suppress(FileNotFoundError):
            if fifo.is_fifo():
                fifo.unlink()
                fifo.write_text("")
        for t in flood:
            t.cancel()
        await mgr.stop_all()
    ok = [r for r in results if isinstance(r, pb.RegisterResponse)]
    refused = [r for r in results if not isinstance(r, pb.RegisterResponse)]
    assert ok and all(r.host_pid == 1007 for r in ok)
    assert all(r == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused), set(refused)


async def test_callers_that_give_up_do_not_leave_walks_running_behind_them(root: Path):
    """A container whose calls time out (or are cancelled) cannot start a new /proc walk per abandoned call."""
    proc = root / "proc"
    held = process(proc, 1007, 7, None)
    fifo = held / "cgroup"
    os.mkfifo(fifo)
    process(proc, 1009, 9, UID_B)
    layout = VDeviceLayout(root / "vm")
    mgr = VDeviceManager(layout, proc)
    ka, kb = allocation_key([UID_A]), allocation_key([UID_B])
    await mgr.start(ka, limits(UID_A))
    await mgr.start(kb, limits(UID_B))
    wfd = -1
    try:
        # it must reach the server (and start the walk the FIFO holds) before it gives up: 2 s, for a loaded machine
        first = asyncio.create_task(register(layout.socket_for(ka), 7, deadline_s=2))
        wfd = await asyncio.wait_for(reader_waiting(fifo), 60)
        codes = {await first}
        for _ in range(6):  # waves of callers that give up while the walk is held
            codes |= set(await asyncio.gather(*(register(layout.socket_for(ka), 7, deadline_s=0.2)
                                                 for _ in range(8))))
        assert codes <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        # every walk thread but one would now be stuck behind the abandoned calls: another pod must still get one
        answer = await asyncio.wait_for(register(layout.socket_for(kb), 9), 60)
        assert isinstance(answer, pb.RegisterResponse) and answer.host_pid == 1009
    finally:
        plain = held / "cgroup.plain"
        plain.write_text(f"0::/kubepods/pod{UID_A}/cri-x\n")
        os.replace(plain, fifo)
        if wfd >= 0:
            os.write(wfd, f"0::/kubepods/pod{UID_A}/cri-x\n".encode())
            os.close(wfd)
        await mgr.stop_all()


@pytest.mark.parametrize("field", ["pod_uid", "container_name", "bus_ids"])
async def test_oversized_fields_are_refused_without_being_echoed(root: Path, field: str):
    layout = VDeviceLayout(root / "vm")
    mgr = VDeviceManager(layout, root / "proc")
    ka = allocation_key([UID_A])
    await mgr.start(ka, limits(UID_A))
    try:
        if field == "bus_ids":
            req = pb.RegisterRequest(bus_ids=[f"0000:{i % 256:02x}:{i // 256:02x}.0" for i in range(3000)])
        else:
            req = pb.RegisterRequest(**{field: "x" * 6000})
        async with grpc.aio.insecure_channel(f"unix://{layout.socket_for(ka)}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.VDeviceStub(ch).Register(req, timeout=30)
        assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    grpc.StatusCode.PERMISSION_DENIED)
        assert len(err.value.details() or "") < 500
    finally:
        await mgr.stop_all()
