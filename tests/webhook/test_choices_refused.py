"""Per-pod choice annotations that cannot be read are refused at creation, naming the annotation and the fix."""

from __future__ import annotations

from tests.webhook.conftest import Webhook
from tests.webhook.reviews import CORE, MEMORY, container, pod, review


async def test_malformed_choice_annotation_is_refused_and_a_good_one_allowed(webhook: Webhook) -> None:
    bad = pod(container("infer", limits={CORE: "30", MEMORY: "4"}))
    bad["metadata"]["annotations"] = {"gpumgr.io/gpu-policy": "fastest"}
    resp = await webhook.review(review(bad))
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert "gpumgr.io/gpu-policy" in resp["status"]["message"] and "binpack, spread, topology" in \
        resp["status"]["message"]
    good = pod(container("infer", limits={CORE: "30", MEMORY: "4"}))
    good["metadata"]["annotations"] = {"hami.io/gpu-scheduler-policy": "spread", "nvidia.com/use-gpuuuid": "GPU-1"}
    assert (await webhook.review(review(good)))["allowed"] is True


async def test_a_model_list_too_long_for_the_extender_is_refused_at_creation(webhook: Webhook) -> None:
    bad = pod(container("infer", limits={CORE: "30", MEMORY: "4"}))
    bad["metadata"]["annotations"] = {"gpumgr.io/gpu-model": ",".join(f"m{i}" for i in range(5000))}
    resp = await webhook.review(review(bad))
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert "gpumgr.io/gpu-model" in resp["status"]["message"] and "at most 32" in resp["status"]["message"]
