"""The webhook over real HTTPS with AdmissionReview v1 bodies: which pods get the gpumgr scheduler."""

from __future__ import annotations

from tests.webhook.conftest import Webhook
from tests.webhook.reviews import CORE, MEMORY, apply, container, patch_of, pod, review


async def test_gpu_pod_without_scheduler_gets_gpumgr_scheduler(webhook: Webhook) -> None:
    p = pod(container("train", limits={CORE: "50", MEMORY: "8"}))
    body = review(p)
    resp = await webhook.review(body)
    assert resp["uid"] == body["request"]["uid"]
    assert resp["allowed"] is True
    mutated = apply(p, patch_of(resp))
    assert mutated["spec"]["schedulerName"] == "gpumgr-scheduler"
    assert mutated["spec"]["containers"] == p["spec"]["containers"]


async def test_default_scheduler_is_replaced(webhook: Webhook) -> None:
    p = pod(container("train", limits={CORE: "200"}), scheduler="default-scheduler")
    resp = await webhook.review(review(p))
    assert patch_of(resp) == [{"op": "replace", "path": "/spec/schedulerName", "value": "gpumgr-scheduler"}]


async def test_requests_only_and_init_containers_count(webhook: Webhook) -> None:
    by_request = pod(container("app", requests={CORE: 100}))
    by_init = pod(container("app"), init=(container("warmup", limits={CORE: "30", MEMORY: "4"}),))
    for p in (by_request, by_init):
        resp = await webhook.review(review(p))
        assert apply(p, patch_of(resp))["spec"]["schedulerName"] == "gpumgr-scheduler"


async def test_pods_left_alone(webhook: Webhook) -> None:
    plain = pod(container("web", limits={"cpu": "1", "memory": "1Gi"}))
    zero = pod(container("app", limits={CORE: "0", MEMORY: "0"}))
    named = pod(container("train", limits={CORE: "100"}), scheduler="gpumgr-scheduler")
    for p in (plain, zero, named):
        resp = await webhook.review(review(p))
        assert resp["allowed"] is True and "patch" not in resp and "status" not in resp, (p, resp)


async def test_other_scheduler_is_kept_with_a_warning(webhook: Webhook) -> None:
    resp = await webhook.review(review(pod(container("train", limits={CORE: "100"}), scheduler="volcano")))
    assert resp["allowed"] is True and "patch" not in resp
    assert "volcano" in resp["warnings"][0] and "gpumgr-scheduler" in resp["warnings"][0]


async def test_only_create_is_mutated_and_only_pods(webhook: Webhook) -> None:
    gpu = pod(container("train", limits={CORE: "150"}))  # would be refused on CREATE
    for body in (review(gpu, operation="UPDATE"), review(None, operation="DELETE"),
                 review({"apiVersion": "v1", "kind": "ConfigMap", "spec": {}}, kind="ConfigMap")):
        resp = await webhook.review(body)
        assert resp == {"uid": body["request"]["uid"], "allowed": True}


async def test_healthz_on_the_same_port(webhook: Webhook) -> None:
    async with webhook.http.get(webhook.url + "/healthz") as r:
        assert r.status == 200
        assert await r.json() == {"status": "alive"}
