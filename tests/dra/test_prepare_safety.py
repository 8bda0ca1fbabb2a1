"""A repeat prepare that fails leaves the running claim alone; prepares of one claim never run side by side; a
prepare cancelled after its commit still ends with the claim either fully prepared or not held at all."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc

from gpumgr.dra.claims import ClaimError
from gpumgr.node.claims import vdevice_key
from gpumgr.pb import vdevice_pb2 as vpb
from gpumgr.pb import vdevice_pb2_grpc as vpb_grpc
from tests.dra.harness import NODE, NS, DraNode, share_request

DRIVER = "vgpu.gpumgr.io"


async def until(pred: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.02)


def allocated_claim(node: DraNode, name: str = "c") -> dict[str, Any]:
    node.create_claim(name, [share_request(memory="1Gi", cores=10)])
    node.create_pod("p", {"gpu": {"resourceClaimName": name}})
    node.scheduler.schedule_pod(NS, "p", [NODE])
    return node.claim(name)


async def test_a_failed_repeat_prepare_leaves_the_running_claim_alone(node: DraNode):
    node.create_claim("c", [share_request(memory="1Gi", cores=10)])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "c"}})
    uid = node.claim("c")["metadata"]["uid"]
    vdir = Path(running.containers["main"].mount_source("/etc/vcuda") or "")
    inode = vdir.stat().st_ino
    assert node.fe is not None
    spec_path = node.fe.preparer.cdi.path_for(uid)
    before = spec_path.read_text()
    # the repeat would write another spec (nvidia-uvm appeared), and that write fails
    node.cfg.dev_root.mkdir(parents=True, exist_ok=True)
    (node.cfg.dev_root / "nvidia-uvm").touch()
    blocker = spec_path.parent / f".{spec_path.name}.tmp"
    blocker.mkdir()
    resp = await node.kubelet.prepare(DRIVER, [(NS, "c", uid)])
    assert resp.claims[uid].error
    assert vdir.stat().st_ino == inode and (vdir / "limits").exists()
    assert spec_path.read_text() == before
    assert len(node.dra_allocations()) == 1
    async with grpc.aio.insecure_channel(f"unix://{vdir}/vcuda.sock") as ch:
        reg = await vpb_grpc.VDeviceStub(ch).Register(vpb.RegisterRequest(), timeout=5)
    assert reg.core_limit == 10
    blocker.rmdir()
    resp = await node.kubelet.prepare(DRIVER, [(NS, "c", uid)])
    assert resp.claims[uid].error == ""
    assert vdir.stat().st_ino == inode and "/dev/nvidia-uvm" in spec_path.read_text()


async def test_prepares_of_one_claim_never_run_side_by_side(node: DraNode, monkeypatch):
    claim = allocated_claim(node)
    uid = claim["metadata"]["uid"]
    assert node.fe is not None
    preparer = node.fe.preparer
    inside, most, calls = [0], [0], [0]
    real = preparer._prepare

    async def get_claim(namespace: str, name: str, uid: str) -> dict[str, Any]:
        return claim

    async def counted(grant: Any, check_health: bool = True) -> Any:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        calls[0] += 1
        try:
            await asyncio.sleep(0.05)
            if calls[0] == 1:
                raise ClaimError("the first one fails")
            return await real(grant, check_health)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(preparer, "get_claim", get_claim)
    monkeypatch.setattr(preparer, "_prepare", counted)
    first = asyncio.create_task(preparer.prepare(NS, "c", uid))
    await until(lambda: calls[0] == 1)  # the first is inside (and fails): on a loaded machine 10 ms may not do
    second = asyncio.create_task(preparer.prepare(NS, "c", uid))  # queued behind the first
    with contextlib.suppress(ClaimError):
        await first
    third = asyncio.create_task(preparer.prepare(NS, "c", uid))
    await asyncio.gather(second, third)
    assert most[0] == 1 and calls[0] == 3
    await preparer.unprepare(uid)
    assert preparer.locks_held() == 0


async def test_a_prepare_cancelled_after_its_commit_ends_consistent(node: DraNode, monkeypatch):
    claim = allocated_claim(node)
    uid = claim["metadata"]["uid"]
    assert node.fe is not None and node.vdevices is not None
    preparer = node.fe.preparer
    started, release = asyncio.Event(), asyncio.Event()
    real_start = node.vdevices.start

    async def slow_start(*args: Any, **kwargs: Any) -> None:
        started.set()
        await release.wait()
        await real_start(*args, **kwargs)

    monkeypatch.setattr(node.vdevices, "start", slow_start)
    task = asyncio.create_task(preparer.prepare(NS, "c", uid))
    await asyncio.wait_for(started.wait(), 5)
    assert node.dra_allocations()  # committed
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    release.set()
    sock = node.layout.socket_for(vdevice_key(uid))
    spec = preparer.cdi.path_for(uid)

    def consistent() -> bool:
        held = bool(node.dra_allocations())
        return (held and sock.exists() and spec.exists()) or (not held and not spec.exists())

    await until(consistent)
