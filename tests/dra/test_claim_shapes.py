"""Claims whose shape the shim cannot enforce as granted are refused per claim (nothing held); a card granted
twice in one claim becomes one CDI device and one limits entry with the amounts summed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumgr.sim.kubelet.dra_kubelet import DraPrepareError
from gpumgr.vdevice.limits import Limits
from tests.dra.harness import GIB, NODE, NS, DraNode, share_request, whole_request


def devices_of(node: DraNode, claim: str) -> list[str]:
    return [r["device"] for r in node.claim(claim)["status"]["allocation"]["devices"]["results"]]


async def test_a_claim_with_different_core_shares_on_two_cards_is_refused(node: DraNode):
    node.create_claim("mixed", [share_request("small", memory="1Gi", cores=20),
                                share_request("big", memory="1Gi", cores=90)])
    with pytest.raises(DraPrepareError) as e:
        await node.run_pod("p", {"gpu": {"resourceClaimName": "mixed"}})
    assert sorted(devices_of(node, "mixed")) == ["gpu-0", "gpu-1"]
    message = e.value.errors["mixed"]
    assert "core" in message and "20" in message and "90" in message
    assert node.dra_allocations() == {} and list(node.cfg.cdi_dir.glob("*.json")) == []


async def test_equal_core_shares_on_two_cards_are_prepared(node: DraNode):
    node.create_claim("even", [share_request("a", memory="1Gi", cores=60),
                               share_request("b", memory="2Gi", cores=60)])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "even"}})
    vdir = running.containers["main"].mount_source("/etc/vcuda")
    assert vdir is not None
    limits = Limits.parse(Path(vdir, "limits").read_text())
    assert limits.core_limit == 60 and len(limits.devices) == 2


async def test_a_fractional_claim_reserved_for_two_pods_is_refused(node: DraNode):
    node.create_claim("shared", [share_request(memory="4Gi", cores=30)])
    for pod in ("p1", "p2"):
        node.create_pod(pod, {"gpu": {"resourceClaimName": "shared"}})
        node.scheduler.schedule_pod(NS, pod, [NODE])
    assert len(node.claim("shared")["status"]["reservedFor"]) == 2
    with pytest.raises(DraPrepareError) as e:
        await node.kubelet.run_pod(NS, "p1")
    assert "shared by 2 pods (p1, p2)" in e.value.errors["shared"]
    assert node.dra_allocations() == {} and list(node.cfg.cdi_dir.glob("*.json")) == []


async def test_a_whole_card_claim_may_be_shared_by_two_pods(node: DraNode):
    node.create_claim("whole", [whole_request()])
    await node.run_pod("p1", {"gpu": {"resourceClaimName": "whole"}})
    second = await node.run_pod("p2", {"gpu": {"resourceClaimName": "whole"}})
    assert "LD_PRELOAD" not in second.containers["main"].env


async def test_one_card_granted_to_two_requests_is_one_cdi_device_with_summed_limits(node: DraNode):
    node.create_claim("twice", [share_request("a", memory="4Gi", cores=30),
                                share_request("b", memory="4Gi", cores=30)])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "twice"}})
    assert devices_of(node, "twice") == ["gpu-0", "gpu-0"]
    edits = running.containers["main"]
    assert edits.env["NVIDIA_VISIBLE_DEVICES"] == node.inventory.gpus[0].uuid
    [device] = running.devices[node.claim("twice")["metadata"]["uid"]]
    assert sorted(device.request_names) == ["a", "b"] and len(device.cdi_device_ids) == 1
    vdir = edits.mount_source("/etc/vcuda")
    assert vdir is not None
    limits = Limits.parse(Path(vdir, "limits").read_text())
    assert limits.core_limit == 60
    assert [(d.index, d.memory_limit_bytes) for d in limits.devices] == [(0, 8 * GIB)]
    assert sum(a.memory_mib for a in node.dra_allocations().values()) == 8192


async def test_a_whole_card_of_odd_memory_size_is_granted_without_a_memory_cap():
    from dataclasses import replace

    from tests.dra.harness import remove_root, short_root

    root = short_root()
    node = DraNode(root, n_gpus=1)
    node.inventory = replace(node.inventory, gpus=(replace(node.inventory.gpus[0], memory_mib=81559),))
    await node.start()  # the API server stand-in refuses a slice whose ranges a real one would refuse
    try:
        node.create_claim("whole", [whole_request()])
        running = await node.run_pod("p", {"gpu": {"resourceClaimName": "whole"}})
        [result] = node.claim("whole")["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"] == {"memory": "81408Mi", "cores": "100"}
        assert "LD_PRELOAD" not in running.containers["main"].env
    finally:
        await node.stop()
        remove_root(root)
