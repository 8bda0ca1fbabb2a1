"""One reconcile round's two passes (the vcuda allocations, then the device plugins' MIG holdings) share the round's
pods (gpumgr/agent/round_pods.py): the pod cache listed once, static pods also under their config.mirror UID, and
at most one fresh list from the API when holders' pods are missing from the cache; each pass listed on its own."""

from __future__ import annotations

from typing import Any

from gpumgr.agent.gone import gone
from gpumgr.agent.round_pods import RoundPods
from gpumgr.kube.pod_cache import MIRROR, PodCache

RUNNING = "11111111-0000-4000-8000-000000000001"
MIRROR_UID = "11111111-0000-4000-8000-000000000002"
STATIC = "kubelet-static-uid"
GONE = "11111111-0000-4000-8000-00000000dead"


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
