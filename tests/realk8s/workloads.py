"""Pods and claims on the test cluster: create, wait for what the real components did, delete."""

from __future__ import annotations

import time
from typing import Any

from tests.realk8s.procs import wait_for

NAMESPACE = "realk8s"
IMAGE = "registry.k8s.io/pause:3.10"
CORE = "tencent.com/vcuda-core"
MEMORY = "tencent.com/vcuda-memory"


def ensure_namespace(core: Any) -> None:
    from kubernetes import client as k

    try:
        core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=NAMESPACE)))
    except k.ApiException as error:
        if error.status != 409:
            raise
    # pods may be created only once the namespace's default ServiceAccount exists
    wait_for("the default ServiceAccount of the test namespace",
             lambda: core.read_namespaced_service_account("default", NAMESPACE), 60)


def gpu_pod(name: str, cores: int, memory_units: int = 0, annotations: dict[str, str] | None = None,
            containers: int = 1) -> dict[str, Any]:
    limits = {CORE: str(cores)}
    if memory_units:
        limits[MEMORY] = str(memory_units)
    return plain_pod(name, annotations, [{"name": f"cuda{i}", "image": IMAGE, "resources": {"limits": limits}}
                                         for i in range(containers)])


def plain_pod(name: str, annotations: dict[str, str] | None = None,
              containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations or {}},
        "spec": {"containers": containers or [{"name": "main", "image": IMAGE}],
                 "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0, **spec},
    }


def create(core: Any, body: dict[str, Any]) -> Any:
    return core.create_namespaced_pod(NAMESPACE, body)


def wait_running(core: Any, name: str, timeout_s: float = 90) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        return pod if pod.status.phase == "Running" else None

    try:
        return wait_for(f"pod {name} Running", running, timeout_s, interval_s=0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(core, name)}") from None


def wait_settled(core: Any, name: str, timeout_s: float = 90) -> Any:
    """The pod once it is Running or Failed."""
    def settled() -> Any:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        return pod if pod.status.phase in ("Running", "Failed") else None

    return wait_for(f"pod {name} Running or Failed", settled, timeout_s, interval_s=0.5)


def describe(core: Any, name: str) -> str:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
    lines = [f"phase={pod.status.phase} node={pod.spec.node_name} scheduler={pod.spec.scheduler_name}",
             f"conditions={[(c.type, c.status, c.reason, c.message) for c in pod.status.conditions or []]}",
             f"containers={[(s.name, s.state) for s in pod.status.container_statuses or []]}"]
    lines += [f"event {e.reason}: {e.message}" for e in events]
    return "\n".join(lines)


def events(core: Any, name: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in
            core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items]


def delete_all(core: Any, timeout_s: float = 90) -> None:
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    wait_for("every test pod gone", lambda: not core.list_namespaced_pod(NAMESPACE).items, timeout_s, interval_s=0.5)


def record_for(node: Any, pod: Any, container: str) -> dict[str, Any]:
    """The CreateContainer request the kubelet sent for that container of that pod (the latest one)."""
    found = [r for r in node.records() if r["pod"]["uid"] == pod.metadata.uid and r["name"] == container]
    assert found, f"no CreateContainer for {pod.metadata.name}/{container}"
    return found[-1]


def pause(seconds: float) -> None:
    time.sleep(seconds)
