"""The admission webhook as the real API server calls it (URL, caBundle, matchConditions, failurePolicy)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import Env
from tests.realk8s.procs import wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def core(realk8s: Env) -> Any:
    api = realk8s.core()
    w.ensure_namespace(api)
    yield api
    w.delete_all(api)


def test_other_pods_are_untouched_and_run_on_the_default_scheduler(realk8s: Env, core: Any) -> None:
    w.create(core, w.plain_pod("plain"))
    pod = w.wait_running(core, "plain")
    assert pod.spec.scheduler_name == "default-scheduler"


def test_webhook_refuses_an_impossible_ask_at_creation(realk8s: Env, core: Any) -> None:
    from kubernetes import client as k

    with pytest.raises(k.ApiException) as refused:
        w.create(core, w.gpu_pod("odd", cores=150))
    assert refused.value.status == 403
    assert "multiple of 100" in str(refused.value.body)


def test_with_the_webhook_down_gpu_pods_are_refused_as_failure_policy_fail_says(realk8s: Env, core: Any) -> None:
    from kubernetes import client as k

    webhook = realk8s.gpumgr.webhook
    assert webhook is not None
    assert realk8s.gpumgr.rendered.all("MutatingWebhookConfiguration")[0]["webhooks"][0]["failurePolicy"] == "Fail"
    webhook.stop()
    try:
        with pytest.raises(k.ApiException) as refused:
            w.create(core, w.gpu_pod("while-down", cores=10, memory_units=4))
        assert refused.value.status == 500 and "failed calling webhook" in str(refused.value.body)
        w.create(core, w.plain_pod("plain-while-down"))  # other pods never wait for the webhook
    finally:
        webhook.start()
    wait_for("the webhook back", lambda: _creates(core), 60, interval_s=0.5)


def _creates(core: Any) -> bool:
    from kubernetes import client as k

    try:
        w.create(core, w.gpu_pod("after", cores=10, memory_units=4))
    except k.ApiException:
        return False
    return True
