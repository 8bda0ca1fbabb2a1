"""End to end through the emulators: the scheduler stand-in allocates claims from the agent's ResourceSlice,
the kubelet emulator prepares them over the DRA socket and resolves the CDI names, the ledger holds exactly
what the claims consumed, and the shim's limits (vDevice server and file) equal the claim's amounts."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpumgr.pb import vdevice_pb2 as vpb
from gpumgr.pb import vdevice_pb2_grpc as vpb_grpc
from gpumgr.sim.dra_scheduler import Unschedulable
from gpumgr.vdevice.limits import Limits
from tests.dra.harness import CARD_MIB, GIB, NS, DraNode, share_request, whole_request

MIB = 2**20


async def register(socket_path: str) -> vpb.RegisterResponse:
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as ch:
        resp: vpb.RegisterResponse = await vpb_grpc.VDeviceStub(ch).Register(vpb.RegisterRequest(), timeout=5)
        return resp


async def test_fractional_claims_fill_one_card_and_the_next_is_refused_by_the_scheduler(node: DraNode):
    node.create_template("share", [share_request(memory="4Gi", cores=30)])
    # fill every card: 3 x 30 cores per card fit (90), a 4th does not (120 > 100); memory 4 x 4Gi would
    ran = []
    for i in range(12):
        ran.append(await node.run_pod(f"p{i}", {"gpu": {"resourceClaimTemplateName": "share"}}))
    per_card: dict[int, int] = {}
    for a in node.dra_allocations().values():
        assert (a.cores, a.memory_mib) == (30, 4096)
        per_card[a.cards[0]] = per_card.get(a.cards[0], 0) + 1
    assert per_card == {0: 3, 1: 3, 2: 3, 3: 3}
    node.create_pod("p-extra", {"gpu": {"resourceClaimTemplateName": "share"}})
    with pytest.raises(Unschedulable, match="capacity left"):
        node.scheduler.schedule_pod(NS, "p-extra", ["dra-node"])
    assert len(node.dra_allocations()) == 12  # the node never saw it
    assert node.api.store.get_pod(NS, "p-extra")["spec"].get("nodeName") is None

    # the shim in the first pod's container gets exactly 4 GiB and 30 cores, from the server and the file
    edits = ran[0].containers["main"]
    vdir = edits.mount_source("/etc/vcuda")
    assert vdir is not None
    resp = await register(f"{vdir}/vcuda.sock")
    assert resp.core_limit == 30 and resp.hard_limit
    assert [d.memory_limit_bytes for d in resp.devices] == [4 * GIB]
    limits = Limits.parse(Path(vdir, "limits").read_text())
    assert limits.core_limit == 30 and [d.memory_limit_bytes for d in limits.devices] == [4 * GIB]
    assert limits.pod_uid == node.api.store.get_pod(NS, "p0")["metadata"]["uid"]
    assert edits.env["LD_PRELOAD"].endswith("libvcuda.so")
    assert edits.env["NVIDIA_VISIBLE_DEVICES"] == node.inventory.gpus[resp.devices[0].index].uuid
    assert [d["path"] for d in edits.device_nodes] == ["/dev/nvidiactl", f"/dev/nvidia{resp.devices[0].index}"]

    # deleting a pod frees its share: the scheduler can place the waiting one, on the freed card
    card = next(a.cards[0] for a in node.dra_allocations().values() if a.pod == "p0")
    assert await node.delete_pod("p0") == {}
    assert len(node.dra_allocations()) == 11
    assert not (node.cfg.cdi_dir / f"gpumgr.io-vgpu_{ran[0].claims['gpu'][1]}.json").exists()
    node.scheduler.schedule_pod(NS, "p-extra", ["dra-node"])
    running = await node.kubelet.run_pod(NS, "p-extra")
    uid = running.claims["gpu"][1]
    assert node.dra_allocations()[f"dra/{uid}/0"].cards == (card,)


async def test_requests_round_up_by_the_request_policy(node: DraNode):
    node.create_claim("odd", [share_request(memory="1000Mi", cores=7)])
    await node.run_pod("p", {"gpu": {"resourceClaimName": "odd"}})
    consumed = node.claim("odd")["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert consumed == {"memory": "1Gi", "cores": "7"}  # 1000Mi -> 4 x 256Mi
    [a] = node.dra_allocations().values()
    assert (a.cores, a.memory_mib) == (7, 1024)


async def test_whole_card_claim_takes_the_card_and_runs_without_limits(node: DraNode):
    node.create_claim("whole", [whole_request()])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "whole"}})
    [a] = node.dra_allocations().values()
    assert (a.cores, a.memory_mib) == (100, CARD_MIB)
    assert node.state is not None and node.state.ledger.card(a.cards[0]).mode == "exclusive"
    edits = running.containers["main"]
    assert "LD_PRELOAD" not in edits.env  # a whole card needs no shim
    resp = await register(f"{edits.mount_source('/etc/vcuda')}/vcuda.sock")
    assert resp.core_limit == 0 and [d.memory_limit_bytes for d in resp.devices] == [0]
    # a share cannot land on that card any more
    node.create_claim("s", [share_request(memory="1Gi", cores=1,
                                          cls="vgpu.gpumgr.io")])
    await node.run_pod("q", {"gpu": {"resourceClaimName": "s"}})
    share = next(x for x in node.dra_allocations().values() if x.cores == 1)
    assert share.cards != a.cards


async def test_two_nvlink_matched_cards(node: DraNode):
    node.create_claim("pair", [whole_request(count=2)],
                      constraints=[{"matchAttribute": "vgpu.gpumgr.io/nvlinkDomain"}])
    # take card 0 first, so a naive pick of the first two free cards (1, 2) would cross NVLink domains
    node.create_claim("first", [whole_request()])
    await node.run_pod("a", {"gpu": {"resourceClaimName": "first"}})
    running = await node.run_pod("b", {"gpu": {"resourceClaimName": "pair"}})
    cards = sorted(a.cards[0] for a in node.dra_allocations().values() if a.claim and a.claim.name == "pair")
    assert cards == [2, 3]
    env = running.containers["main"].env
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [node.inventory.gpus[i].uuid for i in cards]
    assert sorted(d["path"] for d in running.containers["main"].device_nodes) == [
        "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidiactl"]
    # no other NVLink pair is left whole: a second pair claim is refused by the scheduler
    node.create_claim("pair2", [whole_request(count=2)],
                      constraints=[{"matchAttribute": "vgpu.gpumgr.io/nvlinkDomain"}])
    node.create_pod("c", {"gpu": {"resourceClaimName": "pair2"}})
    with pytest.raises(Unschedulable):
        node.scheduler.schedule_pod(NS, "c", ["dra-node"])


async def test_one_claim_shared_by_two_containers_of_a_pod(node: DraNode):
    node.create_claim("shared", [share_request(memory="2Gi", cores=20)])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "shared"}},
                                 containers={"train": ["gpu"], "sidecar": ["gpu"]})
    assert len(node.dra_allocations()) == 1  # one claim, counted once
    a, b = running.containers["train"], running.containers["sidecar"]
    assert a.mount_source("/etc/vcuda") == b.mount_source("/etc/vcuda")
    assert a.env == b.env and a.device_nodes == b.device_nodes
    assert await node.delete_pod("p") == {}
    assert node.dra_allocations() == {}


async def test_prepare_is_idempotent_and_concurrent_calls_are_safe(node: DraNode):
    node.create_claim("c", [share_request(memory="4Gi", cores=50)])
    node.create_pod("p", {"gpu": {"resourceClaimName": "c"}})
    node.scheduler.schedule_pod(NS, "p", ["dra-node"])
    claim = node.claim("c")
    entry = (NS, "c", claim["metadata"]["uid"])
    import asyncio

    answers = await asyncio.gather(*(node.kubelet.prepare("vgpu.gpumgr.io", [entry]) for _ in range(8)))
    ids = {tuple(a.claims[entry[2]].devices[0].cdi_device_ids) for a in answers}
    assert len(ids) == 1 and all(not a.claims[entry[2]].error for a in answers)
    assert len(node.dra_allocations()) == 1
    assert node.state is not None
    card = node.state.ledger.card(next(iter(node.dra_allocations().values())).cards[0])
    assert card.free_cores == 50 and card.free_memory_mib == CARD_MIB - 4096
    # unprepare twice: the second is a no-op without error
    for _ in range(2):
        resp = await node.kubelet.unprepare("vgpu.gpumgr.io", [entry])
        assert resp.claims[entry[2]].error == ""
    assert node.dra_allocations() == {} and card.index in range(4)
    assert node.state.ledger.card(card.index).free_cores == 100
