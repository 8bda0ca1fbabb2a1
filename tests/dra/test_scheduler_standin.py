"""The scheduler stand-in allocates as kube-scheduler's structured-parameters allocator does: request policies,
CEL selectors (a real CEL library), taints and tolerations, allocation modes, constraints."""

from __future__ import annotations

import pytest

from gpumgr.dra.config import DRIVER_NAME
from gpumgr.dra.slices import build_spec
from gpumgr.sim.dra_scheduler import DraScheduler, Unschedulable, round_request
from gpumgr.sim.kubeapi import KubeStore
from tests.dra.harness import NODE, NS, device_classes, inventory

GI = 2**30
MI = 2**20


@pytest.mark.parametrize(("asked", "policy", "want"), [
    (None, {"default": "16Gi", "validRange": {"min": "256Mi", "step": "256Mi"}}, 16 * GI),
    (100 * MI, {"validRange": {"min": "256Mi", "step": "256Mi"}}, 256 * MI),       # below min -> min
    (300 * MI, {"validRange": {"min": "256Mi", "step": "256Mi"}}, 512 * MI),       # rounds up to a step
    (17 * GI, {"validRange": {"min": "256Mi", "max": "16Gi", "step": "256Mi"}}, None),  # above max
    (3, {"validValues": ["1", "4", "8"]}, 4),
    (9, {"validValues": ["1", "4", "8"]}, None),
    (None, None, 16 * GI),                                                          # no policy: all of it
    (5 * GI, None, 5 * GI),
])
def test_request_policy_rounding(asked, policy, want):
    assert round_request(asked, 16 * GI, policy) == want


def store_with_slice(n: int = 4, unhealthy: dict[int, str] | None = None) -> KubeStore:
    store = KubeStore()
    for dc in device_classes():
        store.create_object("deviceclasses", dc)
    store.create_object("resourceslices", {"metadata": {"name": "s"},
                                           "spec": build_spec(inventory(n), NODE, DRIVER_NAME, unhealthy or {},
                                                              256, 1)})
    store.create_pod({"metadata": {"name": "p", "namespace": NS}, "spec": {"containers": [{"name": "c"}]}})
    return store


def claim(store: KubeStore, name: str, requests: list, constraints: list | None = None) -> None:
    spec: dict = {"devices": {"requests": requests}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    store.create_object("resourceclaims", {"metadata": {"name": name}, "spec": spec}, NS)


def devices_of(store: KubeStore, name: str) -> list[str]:
    c = store.get_object("resourceclaims", name, NS)
    assert c is not None
    return [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]


def test_cel_selector_picks_by_attribute_and_capacity():
    store = store_with_slice()
    sel = [{"cel": {"expression": 'device.attributes["vgpu.gpumgr.io"].index == 2 && '
                                  'device.capacity["vgpu.gpumgr.io"].memory.compareTo(quantity("8Gi")) >= 0'}}]
    claim(store, "c", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "selectors": sel}}])
    DraScheduler(store).allocate_claim(NS, "c", NODE, store.get_pod(NS, "p"))
    assert devices_of(store, "c") == ["gpu-2"]
    bad = [{"cel": {"expression": 'device.attributes["vgpu.gpumgr.io"].index =='}}]
    claim(store, "broken", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "selectors": bad}}])
    with pytest.raises(Unschedulable, match="does not compile"):
        DraScheduler(store).allocate_claim(NS, "broken", NODE)


@pytest.mark.parametrize("selectors", [[{"cel": "true"}], ["true"], {"cel": {"expression": "true"}},
                                       [{"cel": {"exp": "true"}}], [{"cel": {"expression": "true"}}] * 33])
def test_a_misshapen_selector_makes_the_claim_unschedulable_not_the_stand_in_crash(selectors):
    store = store_with_slice()
    claim(store, "odd", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "selectors": selectors}}])
    with pytest.raises(Unschedulable, match="selector"):
        DraScheduler(store).allocate_claim(NS, "odd", NODE)
    assert "allocation" not in (store.get_object("resourceclaims", "odd", NS) or {}).get("status", {})


def test_taints_are_avoided_unless_tolerated():
    store = store_with_slice(2, {0: "xid-79"})
    claim(store, "a", [{"name": "g", "exactly": {"deviceClassName": "gpu.gpumgr.io", "count": 2}}])
    with pytest.raises(Unschedulable):
        DraScheduler(store).allocate_claim(NS, "a", NODE)
    tol = [{"key": "vgpu.gpumgr.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    claim(store, "b", [{"name": "g", "exactly": {"deviceClassName": "gpu.gpumgr.io", "count": 2,
                                                   "tolerations": tol}}])
    DraScheduler(store).allocate_claim(NS, "b", NODE)
    assert devices_of(store, "b") == ["gpu-0", "gpu-1"]


def test_all_mode_and_distinct_attribute():
    store = store_with_slice(4)
    claim(store, "all", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "allocationMode": "All",
                                                     "capacity": {"requests": {"cores": "10", "memory": "1Gi"}}}}])
    DraScheduler(store).allocate_claim(NS, "all", NODE)
    assert devices_of(store, "all") == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    claim(store, "spread", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "count": 2,
                                                        "capacity": {"requests": {"cores": "10", "memory": "1Gi"}}}}],
          [{"distinctAttribute": "vgpu.gpumgr.io/nvlinkDomain"}])
    DraScheduler(store).allocate_claim(NS, "spread", NODE)
    assert devices_of(store, "spread") == ["gpu-0", "gpu-2"]
    # asking cores only takes the memory default (the whole card): nothing is left for a third claim
    claim(store, "third", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io",
                                                       "capacity": {"requests": {"cores": "1"}}}}])
    with pytest.raises(Unschedulable, match="capacity left"):
        DraScheduler(store).allocate_claim(NS, "third", NODE)


def test_capacity_a_device_lacks_does_not_match():
    store = store_with_slice(1)
    claim(store, "c", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io",
                                                   "capacity": {"requests": {"bandwidth": "1"}}}}])
    with pytest.raises(Unschedulable, match="no device matches request g"):
        DraScheduler(store).allocate_claim(NS, "c", NODE)
