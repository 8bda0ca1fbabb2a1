"""A model list too long to match cheaply is refused on every node, naming the annotation, and a bounded one works."""

from __future__ import annotations

from typing import Any

from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, inventory, node, pod


async def test_forty_thousand_models_are_refused_not_matched(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("a", inventory(2)))
    s.create_node(node("b", inventory(2)))
    many = ",".join(f"m{i}" for i in range(40_000))  # about 230 KB: within the 256 KiB annotation limit
    bomb = s.create_pod(pod("bomb", [(30, 4)], annotations={podspec.ANN_GPU_MODEL: many}))
    fine = s.create_pod(pod("fine", [(30, 4)], annotations={podspec.ANN_GPU_MODEL_EXCLUDE: "no-such-model"}))
    ext = await start_extender()

    doc = await ext.filter(args(bomb, ["a", "b"]))
    assert doc["NodeNames"] == []
    for name in ("a", "b"):
        why = doc["FailedAndUnresolvableNodes"][name]
        assert podspec.ANN_GPU_MODEL in why and "more than 32 models" in why
    assert (await ext.filter(args(fine, ["a", "b"])))["NodeNames"] == ["a", "b"]
