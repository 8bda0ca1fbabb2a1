"""The limits the node core gives a container's vDevice server, and the memo reconcile reads them through."""

from __future__ import annotations

import copy

from gpumgr.allocator import Allocation, ContainerHolder
from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.node.limits import LimitsMemo, bus_ids, container_limits
from gpumgr.requests import podspec
from tests.helpers import topo_path

INV = inventory_from_topo_file(topo_path("gtx1080ti"), memory_mib=16384)
HOLDER = ContainerHolder("uid-1", "default", "p", "main", memory_units=8)


def pod(annotations: dict[str, str] | None = None) -> dict:
    limits = {podspec.RESOURCE_CORE: "30", podspec.RESOURCE_MEMORY: "8"}
    return {"metadata": {"uid": "uid-1", "name": "p", "namespace": "default", "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def test_a_share_is_limited_to_its_own_ask_not_what_it_reserves_for_a_reusing_container():
    alloc = Allocation("a" + "0" * 24, (1,), 30, 12 * 256, HOLDER, verified=True)  # reserves 12 units for a rider
    limits = container_limits(INV, 256, alloc, pod())
    assert (limits.pod_uid, limits.container_name, limits.core_limit, limits.hard_limit) == ("uid-1", "main", 30, True)
    assert [(d.index, d.memory_limit_bytes) for d in limits.devices] == [(1, 8 * 256 << 20)]
    soft = container_limits(INV, 256, alloc, pod({podspec.ANN_CORE_LIMIT: "10"}))
    assert (soft.hard_limit, soft.core_ceiling) == (False, 30)  # a ceiling below the share is raised to it
    whole = container_limits(INV, 256, Allocation("a" + "1" * 24, (0, 1), 200, 0, HOLDER), pod())
    assert (whole.core_limit, [d.memory_limit_bytes for d in whole.devices]) == (0, [0, 0])
    assert bus_ids(INV, (0, 1)) == {INV.gpus[0].bus_id, INV.gpus[1].bus_id} - {""}


def test_the_memo_answers_again_only_for_the_same_record_and_pod_object():
    memo = LimitsMemo(INV, 256)
    alloc, p = Allocation("a" + "0" * 24, (1,), 30, 8 * 256, HOLDER, verified=True), pod()
    first = memo.get(alloc, p)
    assert memo.get(alloc, p) is first
    # the pod cache replaces a changed pod whole: a new object is read again (here: a soft-limit ceiling added)
    changed = copy.deepcopy(p)
    changed["metadata"]["annotations"][podspec.ANN_CORE_LIMIT] = "60"
    again = memo.get(alloc, changed)
    assert again is not first and (again.hard_limit, again.core_ceiling) == (False, 60)
    memo.keep_only([])
    assert memo.get(alloc, changed) is not again and memo.get(alloc, changed) == again
