"""Two extender replicas electing a leader through a real Lease; the leader killed: pods that run keep their
cards, new pods are admitted by the new leader, nothing is booked twice."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.support import NAMESPACE
from tests.realk8s import workloads as w
from tests.realk8s.conftest import Env
from tests.realk8s.procs import wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def core(realk8s: Env) -> Any:
    api = realk8s.core()
    w.ensure_namespace(api)
    yield api
    w.delete_all(api)


def lease_holder(realk8s: Env) -> str:
    from kubernetes import client as k

    lease = k.CoordinationV1Api(realk8s.cluster.client()).read_namespaced_lease(
        realk8s.gpumgr.name("extender"), NAMESPACE)
    return str(lease.spec.holder_identity or "")


def test_leader_killed_standby_takes_over(realk8s: Env, core: Any) -> None:
    gpumgr = realk8s.gpumgr
    if len(gpumgr.extenders) < 2:
        gpumgr.start_extender(1)
    w.create(core, w.gpu_pod("ha-before", cores=60, memory_units=8))
    before = w.wait_running(core, "ha-before")
    holder = wait_for("a Lease holder", lambda: lease_holder(realk8s), 60)
    leader = next(p for p in gpumgr.extenders if str(holder).startswith(f"{gpumgr.name('extender')}-{p.name[-1]}_"))
    leader.kill9()  # restarted as a standby, as the kubelet would restart it
    wait_for("a new Lease holder", lambda: lease_holder(realk8s) not in ("", holder), 120, interval_s=0.5)
    w.create(core, w.gpu_pod("ha-after", cores=60, memory_units=8))
    after = w.wait_running(core, "ha-after", timeout_s=180)
    # 60 + 60 > 100: the new leader counts the running pod, so the new one is on another card
    assert (after.metadata.annotations["tencent.com/predicate-gpu-idx-0"]
            != before.metadata.annotations["tencent.com/predicate-gpu-idx-0"])
    assert core.read_namespaced_pod("ha-before", w.NAMESPACE).status.phase == "Running"
