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


# -- issue 18, finding 2: annotations changed after creation, where the webhook did not look ------------------------
def _update(new: dict, old: dict | None) -> dict:  # type: ignore[type-arg]
    body = review(new, operation="UPDATE")
    body["request"]["oldObject"] = old
    return body


def _annotated(annotations: dict[str, str], gpu: bool = True) -> dict:  # type: ignore[type-arg]
    p = pod(container("infer", limits={CORE: "30", MEMORY: "4"} if gpu else {}))
    p["metadata"]["annotations"] = dict(annotations)
    return p


async def test_an_update_writing_a_malformed_choice_onto_a_gpu_pod_is_refused(webhook: Webhook) -> None:
    clean = _annotated({})
    for key, value in (("gpumgr.io/gpu-uuid-exclude", ",".join(f"GPU-{i}" for i in range(65))),
                       ("gpumgr.io/gpu-uuid-select", "GPU-1 and more"), ("gpumgr.io/gpu-policy", "fastest"),
                       ("gpumgr.io/gpu-model", ",".join(f"m{i}" for i in range(50)))):
        resp = await webhook.review(_update(_annotated({key: value}), clean))
        assert resp["allowed"] is False and resp["status"]["code"] == 403, (key, resp)
        assert key in resp["status"]["message"] and "set by this update" in resp["status"]["message"], resp
        assert "patch" not in resp


async def test_updates_that_leave_the_choices_as_they_were_or_fix_them_pass(webhook: Webhook) -> None:
    bad = _annotated({"gpumgr.io/gpu-policy": "fastest"})
    relabelled = _annotated({"gpumgr.io/gpu-policy": "fastest"})
    relabelled["metadata"]["labels"] = {"team": "a"}
    relabelled["metadata"]["finalizers"] = []
    for new, old in ((relabelled, bad),  # admitted before the webhook ran: its finalizers must still come off
                     (_annotated({"gpumgr.io/gpu-policy": "spread"}), bad),  # fixed
                     (_annotated({"gpumgr.io/gpu-policy": "fastest"}, gpu=False),
                      _annotated({}, gpu=False))):  # not a GPU pod: the extender never reads it
        resp = await webhook.review(_update(new, old))
        assert resp == {"uid": resp["uid"], "allowed": True}, resp
