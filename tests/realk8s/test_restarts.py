"""Restarts on the real cluster: kill -9 of the agent, a kubelet restart, an API server restart. Pods that run keep
running and keep their cards; new pods are admitted afterwards; capacity comes back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import CARDS, NODE, Env, capacity
from tests.realk8s.procs import wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def core(realk8s: Env) -> Any:
    api = realk8s.core()
    w.ensure_namespace(api)
    yield api
    w.delete_all(api)


def _full_capacity(realk8s: Env) -> bool:
    cap = capacity(realk8s)
    return cap.get(w.CORE) == str(100 * CARDS)


def test_agent_kill9_keeps_running_pods_and_admits_new_ones(realk8s: Env, core: Any) -> None:
    w.create(core, w.gpu_pod("before-kill", cores=40, memory_units=8))
    before = w.wait_running(core, "before-kill")
    card = before.metadata.annotations["tencent.com/predicate-gpu-idx-0"]
    agent = realk8s.gpumgr.agents[NODE]
    generation = agent.generation
    agent.kill9()  # started again, as the kubelet restarts the DaemonSet's container
    wait_for("the agent started again and ready", lambda: agent.generation > generation and _ready(realk8s), 60)
    # A pod the kubelet admits between the plugin's death and its first ListAndWatch after re-registering fails
    # with UnexpectedAdmissionError ("no healthy devices"): real kubelet behaviour, which a pod's controller
    # answers by making a new pod; do the same.
    after = None
    for attempt in range(10):
        name = f"after-kill-{attempt}"
        w.create(core, w.gpu_pod(name, cores=70, memory_units=8))
        after = w.wait_settled(core, name)
        if after.status.phase == "Running":
            break
        assert any(r == "UnexpectedAdmissionError" for r, _ in w.events(core, name)), w.describe(core, name)
    assert after is not None and after.status.phase == "Running"
    # 40 + 70 > 100: the restarted agent still counts the first pod, so the second is on another card
    assert after.metadata.annotations["tencent.com/predicate-gpu-idx-0"] != card
    assert core.read_namespaced_pod("before-kill", w.NAMESPACE).status.phase == "Running"


def _ready(realk8s: Env) -> bool:
    import urllib.request

    port = realk8s.gpumgr.agent_metrics[NODE]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_kubelet_restart_agent_reregisters(realk8s: Env, core: Any) -> None:
    w.create(core, w.gpu_pod("before-kubelet", cores=50, memory_units=8))
    w.wait_running(core, "before-kubelet")
    realk8s.node.restart_kubelet()
    wait_for("capacity back after a kubelet restart", lambda: _full_capacity(realk8s), 120, interval_s=0.5)
    w.create(core, w.gpu_pod("after-kubelet", cores=60, memory_units=8))
    after = w.wait_running(core, "after-kubelet")
    before = core.read_namespaced_pod("before-kubelet", w.NAMESPACE)
    assert before.status.phase == "Running"
    assert (after.metadata.annotations["tencent.com/predicate-gpu-idx-0"]
            != before.metadata.annotations["tencent.com/predicate-gpu-idx-0"])


def test_apiserver_restart_watches_resume(realk8s: Env, core: Any) -> None:
    realk8s.cluster.restart_apiserver()
    core = realk8s.core()
    w.create(core, w.gpu_pod("after-apiserver", cores=20, memory_units=4))
    w.wait_running(core, "after-apiserver", timeout_s=180)
