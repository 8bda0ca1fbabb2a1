"""Restarts lose nothing: the front end rebuilds its claims from the checkpoint, the claims in the API and the
prepared CDI specs; stale specs and freed claims are cleaned up; the kubelet finds the driver again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from gpumgr.dra.config import DRIVER_NAME
from gpumgr.pb import vdevice_pb2 as vpb
from gpumgr.pb import vdevice_pb2_grpc as vpb_grpc
from tests.dra.harness import NODE, NS, DraNode, share_request, whole_request

ROOT = Path(__file__).resolve().parents[2]


async def limits_over_socket(vdir: str) -> vpb.RegisterResponse:
    async with grpc.aio.insecure_channel(f"unix://{vdir}/vcuda.sock") as ch:
        resp: vpb.RegisterResponse = await vpb_grpc.VDeviceStub(ch).Register(vpb.RegisterRequest(), timeout=5)
        return resp


def state_of(node: DraNode) -> dict:
    return {k: (a.cards, a.cores, a.memory_mib) for k, a in node.dra_allocations().items()}


async def test_agent_restart_restores_held_claims_and_cleans_up_the_rest(node: DraNode):
    node.create_claim("keep", [share_request(memory="4Gi", cores=40)])
    node.create_claim("gone", [whole_request()])
    kept = await node.run_pod("a", {"gpu": {"resourceClaimName": "keep"}})
    await node.run_pod("b", {"gpu": {"resourceClaimName": "gone"}})
    before = state_of(node)
    keep_uid = node.claim("keep")["metadata"]["uid"]
    gone_uid = node.claim("gone")["metadata"]["uid"]
    await node.stop_agent()
    # while the agent is down: pod b and its claim go away; a stale spec of an unknown claim lies around
    node.api.store.delete_pod(NS, "b")
    node.api.store.delete_object("resourceclaims", "gone", NS)
    stale = node.cfg.cdi_dir / "gpumgr.io-vgpu_99999999-0000-0000-0000-000000000000.json"
    stale.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "gpumgr.io/vgpu", "devices": []}))
    await node.start_agent()
    assert node.fe is not None and node.fe.recovery is not None
    assert node.fe.recovery.restored == [keep_uid]
    assert sorted(node.fe.recovery.freed) == sorted([gone_uid, "99999999-0000-0000-0000-000000000000"])
    assert state_of(node) == {k: v for k, v in before.items() if keep_uid in k}
    assert not stale.exists()
    assert sorted(p.name for p in node.cfg.cdi_dir.glob("*.json")) == [f"gpumgr.io-vgpu_{keep_uid}.json"]
    # the vDevice server of the kept claim answers again, with the claim's limits
    resp = await limits_over_socket(kept.containers["main"].mount_source("/etc/vcuda") or "")
    assert resp.core_limit == 40 and [d.memory_limit_bytes for d in resp.devices] == [4 * 2**30]
    # the kubelet re-registers the restarted driver and a repeated prepare is a no-op
    await node.kubelet.wait_driver(DRIVER_NAME, after=1)
    resp2 = await node.kubelet.prepare(DRIVER_NAME, [(NS, "keep", keep_uid)])
    assert resp2.claims[keep_uid].error == "" and state_of(node) == {k: v for k, v in before.items() if keep_uid in k}


async def test_lost_checkpoint_is_rebuilt_from_the_claims_and_their_specs(node: DraNode):
    node.create_claim("c1", [share_request(memory="2Gi", cores=25)])
    node.create_claim("c2", [whole_request()])
    await node.run_pod("a", {"gpu": {"resourceClaimName": "c1"}})
    await node.run_pod("b", {"gpu": {"resourceClaimName": "c2"}})
    before = state_of(node)
    await node.stop_agent()
    for f in (node.root / "ckpt").iterdir():
        f.unlink()
    await node.start_agent()
    assert state_of(node) == before


async def test_kubelet_restart_and_a_wiped_registry_lead_to_registration_again(node: DraNode):
    first = node.kubelet.registrations
    await node.kubelet.stop()
    for p in node.cfg.registry_dir.iterdir():  # a kubelet that cleans its registry on start
        p.unlink()
    await node.kubelet.start()
    await node.kubelet.wait_driver(DRIVER_NAME, after=first)
    assert node.fe is not None
    await asyncio.wait_for(node.fe.registration.registered.wait(), 5)
    node.create_claim("c", [share_request()])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "c"}})
    assert running.containers["main"].env["LD_PRELOAD"]


async def test_kill_9_mid_prepare_loses_nothing_and_counts_nothing_twice(node: DraNode):
    await node.stop_agent()
    node.create_template("t", [share_request(memory="1Gi", cores=10)])
    entries = []
    for i in range(24):
        node.create_pod(f"p{i}", {"gpu": {"resourceClaimTemplateName": "t"}})
        node.scheduler.schedule_pod(NS, f"p{i}", [NODE])
        pod = node.api.store.get_pod(NS, f"p{i}")
        name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        entries.append((NS, name, node.claim(name)["metadata"]["uid"]))
    child = subprocess.Popen([sys.executable, "-m", "tests.dra.agent_child", str(node.root),
                              str(node.root / "kubeconfig")], cwd=ROOT, stdout=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert child.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
        assert line.strip() == b"ready"
        await node.kubelet.wait_driver(DRIVER_NAME, after=node.kubelet.registrations)
        call = asyncio.ensure_future(node.kubelet.prepare(DRIVER_NAME, entries))
        while not any(node.cfg.cdi_dir.glob("*.json")) and not call.done():
            await asyncio.sleep(0.001)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        with contextlib.suppress(grpc.aio.AioRpcError):  # the kubelet saw the driver die; it calls again
            await call
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    await node.start_agent()
    # whatever the crash left, each claim is either wholly held (ledger + spec) or not at all
    held = {k.split("/")[1] for k in node.dra_allocations()}
    specced = {p.name.removeprefix("gpumgr.io-vgpu_").removesuffix(".json")
               for p in node.cfg.cdi_dir.glob("*.json")}
    assert held == specced
    # the kubelet retries: every claim prepared exactly once, the card totals add up
    await node.kubelet.wait_driver(DRIVER_NAME, after=node.kubelet.registrations)
    resp = await node.kubelet.prepare(DRIVER_NAME, entries)
    assert all(resp.claims[uid].error == "" for _, _, uid in entries)
    assert len(node.dra_allocations()) == 24
    assert node.state is not None
    used = sum(100 - c.free_cores for c in node.state.ledger.cards)
    assert used == 24 * 10
    assert len(list(node.cfg.cdi_dir.glob("*.json"))) == 24
