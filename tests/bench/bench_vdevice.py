"""vDevice Register under a flood: one container sends FLOOD concurrent Register calls (each asking for its host
PID, a /proc walk) while another container registers and admission writes a new container's limits.

The host's /proc is a temp tree of PROCS processes, so a walk costs what reading that many `status` files costs.
Prints the victim's Register latency and the limits write (PreStart) latency with and without the flood, and
how the flood's calls ended (answered or RESOURCE_EXHAUSTED). Before the per-socket bounds, the victim and the
limits write queued behind every flooded walk.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import grpc

from gpumgr.pb import vdevice_pb2 as pb
from gpumgr.pb import vdevice_pb2_grpc as pb_grpc
from gpumgr.vdevice.layout import VDeviceLayout, allocation_key
from gpumgr.vdevice.limits import DeviceLimit, Limits
from gpumgr.vdevice.server import VDeviceManager
from tests.bench.stats import summary_ms

PROCS = 3000
FLOOD = 128
ROUNDS = 10


def limits(uid: str) -> Limits:
    return Limits(pod_uid=uid, container_name="main", core_limit=30, hard_limit=True, core_ceiling=0,
                  devices=(DeviceLimit(uuid="GPU-0", index=0, memory_limit_bytes=1 << 30),))


def fake_proc(root: Path, uids: dict[int, str]) -> Path:
    proc = root / "proc"
    for pid in range(1000, 1000 + PROCS):
        d = proc / str(pid)
        d.mkdir(parents=True)
        ns = pid - 1000 + 1
        (d / "status").write_text(f"Name:\tx\nPid:\t{pid}\nNSpid:\t{pid}\t{ns}\n")
        (d / "cgroup").write_text(f"0::/kubepods/pod{uids.get(ns, 'none')}/cri-x\n")
    return proc


async def call(ch: grpc.aio.Channel, pid: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        await pb_grpc.VDeviceStub(ch).Register(pb.RegisterRequest(pid=pid), timeout=120)
        code = "OK"
    except grpc.aio.AioRpcError as e:
        code = e.code().name
    return time.perf_counter() - t0, code


async def run(root: Path) -> None:
    uids = {PROCS - 1: "aaaa-flood", PROCS: "bbbb-victim"}  # the processes the walks find last
    proc = fake_proc(root, uids)
    layout = VDeviceLayout(root / "vm")
    mgr = VDeviceManager(layout, proc)
    ka, kb = allocation_key(["a"]), allocation_key(["b"])
    await mgr.start(ka, limits("aaaa-flood"))
    await mgr.start(kb, limits("bbbb-victim"))
    try:
        async with grpc.aio.insecure_channel(f"unix://{layout.socket_for(ka)}") as fch, \
                grpc.aio.insecure_channel(f"unix://{layout.socket_for(kb)}") as vch:
            quiet_victim, quiet_admit, loud_victim, loud_admit = [], [], [], []
            codes: dict[str, int] = {}
            for r in range(ROUNDS):
                quiet_victim.append((await call(vch, PROCS))[0])
                t0 = time.perf_counter()
                await mgr.start(allocation_key([f"q{r}"]), limits(f"q{r}"))
                quiet_admit.append(time.perf_counter() - t0)
            for r in range(ROUNDS):
                flood = [asyncio.create_task(call(fch, PROCS - 1)) for _ in range(FLOOD)]
                await asyncio.sleep(0)
                loud_victim.append((await call(vch, PROCS))[0])
                t0 = time.perf_counter()
                await mgr.start(allocation_key([f"l{r}"]), limits(f"l{r}"))
                loud_admit.append(time.perf_counter() - t0)
                for _, code in await asyncio.gather(*flood):
                    codes[code] = codes.get(code, 0) + 1
    finally:
        await mgr.stop_all()
    print(f"/proc of {PROCS} processes; flood of {FLOOD} concurrent Register calls on one socket, {ROUNDS} rounds")
    print(f"victim Register, quiet:   {summary_ms(quiet_victim)}")
    print(f"victim Register, flooded: {summary_ms(loud_victim)}")
    print(f"limits write + server start (admission), quiet:   {summary_ms(quiet_admit)}")
    print(f"limits write + server start (admission), flooded: {summary_ms(loud_admit)}")
    print(f"flooded calls ended: {dict(sorted(codes.items()))}")


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="vdb", dir="/tmp"))
    try:
        asyncio.run(run(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
