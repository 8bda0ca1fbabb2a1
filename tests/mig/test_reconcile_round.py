"""One reconcile round's two passes (the vcuda allocations, then the device plugins' MIG holdings) share the round's
pods (gpumgr/agent/round_pods.py): the pod cache listed once, static pods also under their config.mirror UID, and
at most one fresh list from the API when holders' pods are missing from the cache; each pass listed on its own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpumgr.agent.gone import gone
from gpumgr.agent.round_pods import RoundPods
from gpumgr.allocator import Allocation, Ledger
from gpumgr.allocator.mig_slots import MigSlot
from gpumgr.deviceplugin import mig as mig_plugin
from gpumgr.devices.types import GPU, Inventory
from gpumgr.kube.pod_cache import MIRROR, PodCache
from gpumgr.mig.holdings import reconcile_holdings
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.kubelet_checkpoint import KubeletCheckpoint, PodDeviceEntry
from gpumgr.node.state import NodeState

RUNNING = "11111111-0000-4000-8000-000000000001"
MIRROR_UID = "11111111-0000-4000-8000-000000000002"
STATIC = "kubelet-static-uid"
GONE = "11111111-0000-4000-8000-00000000dead"
NEW = "11111111-0000-4000-8000-000000000003"
MIG_1G = "nvidia.com/mig-7g.80gb"


class Kube:
    """The API's list of the node's pods, counted (a real PodCache reads it)."""

    def __init__(self, pods: list[dict[str, Any]]):
        self.pods, self.lists, self.fail = pods, 0, False

    async def list_node_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.fail:
            raise ConnectionError("API server unreachable")
        return [dict(p) for p in self.pods], str(self.lists)


def pod(uid: str, name: str, mirror: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": name, "namespace": "ml", "resourceVersion": "1"}
    if mirror:
        meta["annotations"] = {MIRROR: mirror}
    return {"metadata": meta, "spec": {"nodeName": "node-a"}, "status": {"phase": "Running"}}


async def cache_of(kube: Kube) -> PodCache:
    cache = PodCache(kube, "node-a")  # type: ignore[arg-type]
    assert await cache.live_uids() is not None  # fills the cache, as its watch would
    return cache


async def test_the_two_passes_of_a_round_make_one_fresh_list_between_them():
    kube = Kube([pod(RUNNING, "a"), pod(MIRROR_UID, "static", mirror=STATIC)])
    cache = await cache_of(kube)
    round_pods = RoundPods(cache)
    assert set(round_pods.by_uid) == {RUNNING, MIRROR_UID, STATIC}
    assert round_pods.by_uid[STATIC] is round_pods.by_uid[MIRROR_UID]

    lists = kube.lists
    assert await gone(round_pods, [("vcuda", GONE), ("kept", RUNNING)]) == ["vcuda"]  # reconcile.py's pass
    assert await gone(round_pods, [("mig", GONE)]) == ["mig"]  # holdings.py's pass, same round
    assert kube.lists == lists + 1

    lists = kube.lists  # what each pass did on its own: a list each
    await gone(cache, [("vcuda", GONE)])
    await gone(cache, [("mig", GONE)])
    assert kube.lists == lists + 2


async def test_an_api_that_cannot_be_asked_is_asked_once_a_round_and_frees_nothing():
    kube = Kube([pod(RUNNING, "a")])
    round_pods = RoundPods(await cache_of(kube))
    kube.fail = True
    lists = kube.lists
    assert await gone(round_pods, [("vcuda", GONE)]) == []
    assert await gone(round_pods, [("mig", GONE)]) == []
    assert kube.lists == lists + 1
    kube.fail = False
    assert await gone(RoundPods(round_pods.source), [("mig", GONE)]) == ["mig"]  # the next round asks again


class Service:
    """What the MIG holdings' pass reads of the agent's service: the node's state, the kubelet's record (its
    entries, as the kubelet's checkpoint file would give them) and release."""

    def __init__(self, state: NodeState, pods: PodCache):
        self.state, self.pods, self.entries = state, pods, list[PodDeviceEntry]()

    async def kubelet_checkpoint(self) -> KubeletCheckpoint:
        return KubeletCheckpoint(entries=tuple(self.entries), registered_devices={})

    async def release(self, keys: list[str], why: str, expect: Any = None) -> list[Allocation]:
        def free(led: Ledger) -> list[Allocation]:
            return [a for k in keys if (expect is None or expect.get(k) == led.held_by(k))
                    and (a := led.release(k)) is not None]

        return await self.state.commit(free)


async def hold(service: Service, card: int, uid: str) -> str:
    """The MIG plugin's Allocate of card `card`'s instance for pod `uid`, recorded by the kubelet."""
    slot = next(s for s in service.state.ledger.slots.values() if s.card == card)
    key = mig_plugin.allocation_key(slot.uuid)
    await service.state.commit(lambda led: led.assign(Allocation(key=key, cards=(card,), cores=100, mig=slot.name,
                                                                 created=int(time.time()))))
    service.entries.append(PodDeviceEntry(uid, "main", MIG_1G, (slot.uuid,)))
    return key


async def test_a_holding_made_during_the_round_is_not_judged_by_the_round_s_older_fresh_list(tmp_path: Path):
    inv = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-round", minor=i, name="NVIDIA H100 80GB HBM3",
                                   memory_mib=81920) for i in range(2)), levels=(("X", "NV18"), ("NV18", "X")))
    state = NodeState("node-a", inv, CheckpointStore(tmp_path / "ckpt"))

    def instances(led: Ledger) -> None:
        for card in (0, 1):
            led.set_mig_mode(card, True)
            led.add_slot(MigSlot(card=card, start=0, size=8, profile_id=0, profile="7g.80gb", memory_mib=81920,
                                 gi=0, ci=0, uuid=f"MIG-{card}0000000-0000-4000-8000-000000000000"))

    await state.commit(instances)
    kube = Kube([pod(RUNNING, "a")])
    service = Service(state, await cache_of(kube))
    old = await hold(service, 1, GONE)  # its pod was deleted; the cache missed it
    round_pods = RoundPods(service.pods, state.ledger.allocations)  # the round begins (gpumgr/agent/daemon.py)
    assert await gone(round_pods, [("vcuda", GONE)]) == ["vcuda"]  # the vcuda pass's fresh list
    lists = kube.lists

    new = pod(NEW, "b")  # meanwhile a pod is bound and the MIG plugin's Allocate holds an instance for it
    kube.pods.append(new)
    key = await hold(service, 0, NEW)
    await reconcile_holdings(service, {MIG_1G: "7g.80gb"}, 60.0, "periodic",  # type: ignore[arg-type]
                             round_pods=round_pods)
    assert state.ledger.held_by(key) is not None  # before: released, its pod missing from a list older than it
    assert state.ledger.held_by(old) is None  # what the round began with is judged by its one fresh list
    assert kube.lists == lists

    # the next round judges it by its own fresh list, made after the holding: its pod is there
    await reconcile_holdings(service, {MIG_1G: "7g.80gb"}, 60.0, "next round",  # type: ignore[arg-type]
                             round_pods=RoundPods(service.pods, state.ledger.allocations))
    assert state.ledger.held_by(key) is not None and kube.lists == lists + 1
