"""`both` mode: device-plugin pods and DRA claims share one ledger; the slice shows only what the device-plugin
pods leave, so the scheduler never double-books, and the node refuses what does not fit."""

from __future__ import annotations

import asyncio

from gpumgr.allocator.ledger import Allocation, ContainerHolder
from tests.dra.harness import CARD_MIB, NS, DraNode, share_request


def devices(node: DraNode) -> list[dict]:
    [s] = node.api.store.list_resource("resourceslices")
    return list(s["spec"]["devices"])


def gpu0(node: DraNode) -> dict:
    [s] = node.api.store.list_resource("resourceslices")
    return s["spec"]["devices"][0]["capacity"]


async def until(pred, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end
        await asyncio.sleep(0.02)


async def test_device_plugin_pod_and_dra_claim_on_one_card(node: DraNode):
    assert node.state is not None
    await until(lambda: len(node.api.store.list_resource("resourceslices")) == 1)
    # a gpu-manager pod (device-plugin front end) holds 60 cores and 8 GiB of gpu-0
    dp = Allocation(key="a00000000000000000000dp01", cards=(0,), cores=60, memory_mib=8192,
                    holder=ContainerHolder("dp-uid", NS, "dp-pod", "main"), verified=True)
    await node.state.commit(lambda led: led.assign(dp))
    await until(lambda: gpu0(node)["cores"]["value"] == "40")
    # a range the API server accepts: max is what is left, never above the value
    assert gpu0(node)["cores"]["requestPolicy"]["validRange"]["max"] == "40"
    assert gpu0(node)["memory"]["value"] == f"{(CARD_MIB - 8192) // 1024}Gi"
    # a 40-core / 8 GiB DRA claim fits beside it on the same card; the node agrees
    node.create_claim("fits", [share_request(memory="8Gi", cores=40)])
    await node.run_pod("dra-a", {"gpu": {"resourceClaimName": "fits"}})
    assert node.claim("fits")["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    card = node.state.ledger.card(0)
    assert card.free_cores == 0 and card.free_memory_mib == 0
    assert set(card.holders) == {dp.key, f"dra/{node.claim('fits')['metadata']['uid']}/0"}
    # the next claim goes to another card: gpu-0 is full for DP and DRA together
    node.create_claim("next", [share_request(memory="1Gi", cores=10)])
    await node.run_pod("dra-b", {"gpu": {"resourceClaimName": "next"}})
    assert node.claim("next")["status"]["allocation"]["devices"]["results"][0]["device"] != "gpu-0"
    # the device-plugin pod leaves: the slice shows the card's full capacity again
    await node.state.commit(lambda led: led.release(dp.key))
    await until(lambda: gpu0(node)["cores"]["value"] == "100")
    # DRA claims still hold their part, by the scheduler's own running totals: 60 cores are left on gpu-0
    node.create_claim("third", [share_request(memory="1Gi", cores=60)])
    await node.run_pod("dra-c", {"gpu": {"resourceClaimName": "third"}})
    assert node.claim("third")["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert node.state.ledger.card(0).free_cores == 0


async def test_a_card_held_whole_by_device_plugin_pods_leaves_the_slice_and_comes_back(node: DraNode):
    assert node.state is not None
    dp = Allocation(key="a00000000000000000000dp02", cards=(0,), cores=100, memory_mib=CARD_MIB,
                    holder=ContainerHolder("dp-uid", NS, "dp-pod", "main"), verified=True)
    await node.state.commit(lambda led: led.assign(dp))
    await until(lambda: [d["name"] for d in devices(node)] == ["gpu-1", "gpu-2", "gpu-3"])
    await node.state.commit(lambda led: led.release(dp.key))
    await until(lambda: [d["name"] for d in devices(node)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])


async def test_claim_vdevice_keys_name_the_directories_of_held_claims(node: DraNode):
    from gpumgr.node.claims import claim_vdevice_keys

    node.create_claim("c", [share_request(memory="1Gi", cores=10)])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "c"}})
    assert node.state is not None
    keys = claim_vdevice_keys(node.state.ledger)
    vdir = running.containers["main"].mount_source("/etc/vcuda") or ""
    assert keys == {vdir.rsplit("/", 1)[-1]} == set(node.layout.keys())
