"""Per-pod choices and per-card cordon in filter and bind, over HTTP, on clusters seeded in the API test server."""

from __future__ import annotations

from typing import Any

from gpumgr.requests import podspec
from gpumgr.requests.choices import ANN_CORDON, ANN_POLICY, ANN_UUID_EXCLUDE, ANN_UUID_SELECT, HAMI_USE_UUID
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, holding, inventory, node, pod


def cordoned(name: str, inv: Any, text: str) -> dict[str, Any]:
    n = node(name, inv)
    n["metadata"]["annotations"][ANN_CORDON] = text
    return n


async def test_filter_honours_uuid_choices_and_cordon(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    a, b = inventory(2), inventory(2)
    s.create_node(node("a", a))
    s.create_node(cordoned("b", b, "0,1"))
    pick = s.create_pod(pod("pick", [(30, 4)], annotations={ANN_UUID_SELECT: b.gpus[1].uuid}))
    hami = s.create_pod(pod("hami", [(30, 4)], annotations={HAMI_USE_UUID: a.gpus[1].uuid}))
    excl = s.create_pod(pod("excl", [(100, 0)], annotations={ANN_UUID_EXCLUDE: f"{a.gpus[0].uuid},{a.gpus[1].uuid}"}))
    bad = s.create_pod(pod("bad", [(30, 4)], annotations={ANN_POLICY: "fastest"}))
    ext = await start_extender()

    doc = await ext.filter(args(pick, ["a", "b"]))
    assert doc["NodeNames"] == []
    assert "none of the cards named in gpumgr.io/gpu-uuid-select" in doc["FailedAndUnresolvableNodes"]["a"]
    assert "cordoned" in doc["FailedAndUnresolvableNodes"]["b"]
    assert (await ext.filter(args(hami, ["a", "b"])))["NodeNames"] == ["a"]
    doc = await ext.filter(args(excl, ["a", "b"]))
    assert doc["NodeNames"] == [] and "every card of this node is excluded" in doc["FailedAndUnresolvableNodes"]["a"]
    assert "b" in doc["FailedAndUnresolvableNodes"]
    doc = await ext.filter(args(bad, ["a"]))
    assert ANN_POLICY in doc["FailedAndUnresolvableNodes"]["a"] and "binpack, spread, topology" in \
        doc["FailedAndUnresolvableNodes"]["a"]


async def test_bind_keeps_off_a_cordoned_card_and_honours_spread(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(cordoned("n", inventory(3), "0"))
    s.create_pod(holding("old", "n", [(30, 8, [0])]))  # keeps running on the cordoned card
    packed = s.create_pod(pod("packed", [(30, 8)]))
    ext = await start_extender()
    assert await ext.bind(packed, "n") == ""
    ann = (s.get_pod("default", "packed") or {})["metadata"]["annotations"]
    assert ann[f"{podspec.ANN_PREDICATE_IDX}0"] in ("1", "2")  # binpack would share card 0, it is cordoned
    first = ann[f"{podspec.ANN_PREDICATE_IDX}0"]
    spread = s.create_pod(pod("spread", [(30, 8)], annotations={ANN_POLICY: "spread"}))
    assert await ext.bind(spread, "n") == ""
    ann = (s.get_pod("default", "spread") or {})["metadata"]["annotations"]
    assert ann[f"{podspec.ANN_PREDICATE_IDX}0"] not in ("0", first)  # the emptiest card
