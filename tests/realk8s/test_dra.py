"""DRA on a real cluster: the chart's DeviceClasses, the agent's ResourceSlices, claims allocated by the real
kube-scheduler (consumable capacity) and prepared by the real kubelet through the agent's DRA plugin; device
health streamed to the kubelet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import NODE, Env
from tests.realk8s.procs import wait_for

DRIVER = "vgpu.gpumgr.io"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def apis(realk8s: Env) -> Any:
    from kubernetes import client as k

    core = realk8s.core()
    w.ensure_namespace(core)
    custom = k.CustomObjectsApi(realk8s.cluster.client())
    yield core, custom
    w.delete_all(core)
    custom.delete_collection_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims")
    wait_for("every claim gone", lambda: not custom.list_namespaced_custom_object(
        "resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims")["items"], 60)


def claim(name: str, device_class: str, capacity: dict[str, str] | None = None, count: int = 1,
          same_nvlink: bool = False, minor: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if minor is not None:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].minor == {int(minor)}'}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if same_nvlink:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": w.NAMESPACE}, "spec": {"devices": devices}}


def claim_pod(name: str, claim_name: str) -> dict[str, Any]:
    pod = w.plain_pod(name, containers=[{"name": "cuda", "image": w.IMAGE,
                                         "resources": {"claims": [{"name": "gpu"}]}}])
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return pod


def get_claim(custom: Any, name: str) -> dict[str, Any]:
    return dict(custom.get_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims", name))


def test_slices_published_for_the_node(realk8s: Env, apis: Any) -> None:
    _, custom = apis

    def devices() -> list[dict[str, Any]] | None:
        slices = custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
        ours = [s for s in slices if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE]
        assert len(ours) == 1
        found = ours[0]["spec"]["devices"]
        # in both mode a card a device-plugin pod holds whole is left out until the agent has released it
        return found if sorted(d["name"] for d in found) == [f"gpu-{i}" for i in range(4)] else None

    published = wait_for("every card in the node's ResourceSlice", devices, 60)
    assert isinstance(published, list)
    assert all(d["allowMultipleAllocations"] for d in published)
    assert {d["capacity"]["cores"]["value"] for d in published} == {"100"}


def test_share_claims_allocated_prepared_and_limited(realk8s: Env, apis: Any) -> None:
    core, custom = apis
    share = {"memory": "4Gi", "cores": "30"}
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("share", DRIVER, share))
    w.create(core, claim_pod("dra-share", "share"))
    pod = w.wait_running(core, "dra-share")
    status = get_claim(custom, "share")["status"]
    [result] = status["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == NODE and result.get("shareID")
    assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}
    record = w.record_for(realk8s.node, pod, "cuda")
    assert len(record["cdiDevices"]) == 1 and record["cdiDevices"][0].startswith("gpumgr.io/vgpu=")
    # the CDI spec the agent wrote for the runtime carries the limits file of this claim
    spec_dir = realk8s.node.dir / "agent" / "cdi"
    specs = list(spec_dir.glob("*.json"))
    assert specs, f"no CDI spec in {spec_dir}"
    limits = _find_limits(realk8s.node.dir / "agent" / "vm", "30")
    assert limits["core_limit"] == "30" and limits["device0_memory_limit"] == str(4 << 30), limits


def test_whole_card_and_nvlink_pair_claims(realk8s: Env, apis: Any) -> None:
    core, custom = apis
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("whole", "gpu.gpumgr.io"))
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("pair", "gpu.gpumgr.io", count=2, same_nvlink=True))
    w.create(core, claim_pod("dra-whole", "whole"))
    w.create(core, claim_pod("dra-pair", "pair"))
    w.wait_running(core, "dra-whole")
    pair_pod = w.wait_running(core, "dra-pair")
    results = get_claim(custom, "pair")["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    slices = custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    attrs = {d["name"]: d["attributes"] for s in slices if s["spec"]["driver"] == DRIVER
             for d in s["spec"].get("devices") or []}  # a MIG card's counter slice has no devices
    domains = {attrs[r["device"]]["nvlinkDomain"]["string"] for r in results}
    assert len(domains) == 1
    assert len(w.record_for(realk8s.node, pair_pod, "cuda")["cdiDevices"]) == 2


def test_claim_over_a_cards_capacity_stays_pending(realk8s: Env, apis: Any) -> None:
    core, custom = apis
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("too-big", DRIVER, {"memory": "64Gi", "cores": "10"}))
    w.create(core, claim_pod("dra-too-big", "too-big"))

    def unschedulable() -> str | None:
        pod = core.read_namespaced_pod("dra-too-big", w.NAMESPACE)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return str(c.message)
        return None

    message = wait_for("the scheduler's reason for the claim", unschedulable, 60)
    assert "cannot allocate all claims" in str(message), message
    assert core.read_namespaced_pod("dra-too-big", w.NAMESPACE).status.phase == "Pending"


def test_kubelet_gets_device_health_over_v1alpha1(realk8s: Env, apis: Any) -> None:
    # The 1.36 kubelet calls /v1alpha1.DRAResourceHealth/NodeWatchResources; with the old `package v1` it got
    # Unimplemented ("Method not found") every few seconds and never saw a card's health.
    core, custom = apis
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("health", DRIVER, {"memory": "1Gi", "cores": "5"}))
    w.create(core, claim_pod("dra-health", "health"))
    w.wait_running(core, "dra-health")

    def health() -> list[Any] | None:
        pod = core.read_namespaced_pod("dra-health", w.NAMESPACE)
        statuses = pod.status.container_statuses or []
        found = [r for s in statuses for r in (s.allocated_resources_status or [])]
        return found or None

    found = wait_for("allocatedResourcesStatus in the pod's status", health, 60)
    assert isinstance(found, list)
    healths = [h.health for r in found for h in (r.resources or [])]
    assert healths and all(h == "Healthy" for h in healths), found
    kubelet_log = realk8s.node.kubelet.logs() if realk8s.node.kubelet else ""
    assert "NodeWatchResources" not in kubelet_log or "Method not found" not in kubelet_log


def _find_limits(root: Path, core_limit: str) -> dict[str, str]:
    for path in root.glob("*/limits"):
        lines = [x for x in path.read_text().splitlines() if "=" in x and not x.startswith("#")]
        kv = dict(x.split("=", 1) for x in lines)
        if kv.get("core_limit") == core_limit:
            return kv
    raise AssertionError(f"no limits file with core_limit={core_limit} under {root}")


def test_both_mode_pod_and_claims_share_a_card_without_over_commit(realk8s: Env, apis: Any) -> None:
    core, custom = apis
    w.create(core, w.gpu_pod("dp-60", cores=60, memory_units=16))
    pod = w.wait_running(core, "dp-60")
    minor = pod.metadata.annotations["tencent.com/predicate-gpu-idx-0"]
    # the card's slice now offers what the pod leaves (40 cores): a 30-core claim on it is allocated and runs ...
    share = {"memory": "2Gi", "cores": "30"}
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("beside-1", DRIVER, share, minor=minor))
    w.create(core, claim_pod("beside-1", "beside-1"))
    w.wait_running(core, "beside-1")
    # ... and a second one (60 + 30 + 30 > 100) is not
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                           claim("beside-2", DRIVER, share, minor=minor))
    w.create(core, claim_pod("beside-2", "beside-2"))

    def unschedulable() -> bool:
        found = core.read_namespaced_pod("beside-2", w.NAMESPACE).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in found)

    wait_for("the over-committing claim refused by the scheduler", unschedulable, 60)
    assert "allocation" not in get_claim(custom, "beside-2").get("status", {})
