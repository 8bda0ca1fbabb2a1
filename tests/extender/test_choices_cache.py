"""Issue 18, finding 2: a malformed choice annotation must neither poison the filter cache for clean pods of the
same shape nor be ignored because a clean pod's verdict was cached first (docs/scheduling-choices.md).

Before the fix the cache key held the shape and the parsed choices only (a malformed list parses to no choices),
so both orders below failed: clean pods passed 0 nodes after a malformed one, and a malformed pod passed every
node after a clean one."""

from __future__ import annotations

from typing import Any

import pytest

from gpumgr.requests.choices import ANN_POLICY, ANN_UUID_EXCLUDE, ANN_UUID_SELECT
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, inventory, node, pod

NODES = ["a", "b", "c"]
MALFORMED = {
    ANN_UUID_EXCLUDE: ",".join(f"GPU-{i:08x}" for i in range(65)),  # one entry over the 64 allowed
    ANN_UUID_SELECT: "GPU-1234 and the rest",  # a space is no UUID character
    ANN_POLICY: "fastest",
}


async def _seed(api: KubeApiServer, start_extender: Any) -> Any:
    for name in NODES:
        api.store.create_node(node(name, inventory(2)))
    return await start_extender()


async def _refused_everywhere(ext: Any, p: dict[str, Any], annotation: str) -> None:
    doc = await ext.filter(args(p, NODES))
    assert doc["NodeNames"] == [], doc
    never = doc["FailedAndUnresolvableNodes"]
    assert sorted(never) == NODES and all(annotation in why for why in never.values()), never


@pytest.mark.parametrize("annotation", sorted(MALFORMED))
async def test_a_malformed_pod_first_does_not_poison_clean_pods(api: KubeApiServer, start_extender: Any,
                                                               annotation: str) -> None:
    ext = await _seed(api, start_extender)
    bad = api.store.create_pod(pod("bad", [(30, 4)], annotations={annotation: MALFORMED[annotation]}))
    clean = api.store.create_pod(pod("clean", [(30, 4)]))
    await _refused_everywhere(ext, bad, annotation)
    doc = await ext.filter(args(clean, NODES))
    assert doc["NodeNames"] == NODES, doc
    assert await ext.bind(clean, "a") == ""


@pytest.mark.parametrize("annotation", sorted(MALFORMED))
async def test_a_malformed_pod_after_a_clean_one_is_not_ignored(api: KubeApiServer, start_extender: Any,
                                                                annotation: str) -> None:
    ext = await _seed(api, start_extender)
    clean = api.store.create_pod(pod("clean", [(30, 4)]))
    bad = api.store.create_pod(pod("bad", [(30, 4)], annotations={annotation: MALFORMED[annotation]}))
    assert (await ext.filter(args(clean, NODES)))["NodeNames"] == NODES
    await _refused_everywhere(ext, bad, annotation)
    assert await ext.bind(bad, "a") != ""  # never bound with its annotation ignored


async def test_two_differently_malformed_pods_each_get_their_own_reason(api: KubeApiServer,
                                                                        start_extender: Any) -> None:
    ext = await _seed(api, start_extender)
    one = api.store.create_pod(pod("one", [(30, 4)], annotations={ANN_POLICY: "fastest"}))
    two = api.store.create_pod(pod("two", [(30, 4)], annotations={ANN_UUID_SELECT: "GPU-1234 and the rest"}))
    await _refused_everywhere(ext, one, ANN_POLICY)
    await _refused_everywhere(ext, two, ANN_UUID_SELECT)
