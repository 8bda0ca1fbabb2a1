"""The extender's count of the MIG instances bound pods hold per node (`ClusterView.mig_in_use()`): a node and
resource whose pods are all gone leave no entry behind, so the count does not grow with every node and profile
ever used (the filter's verdicts, tests/extender/test_mig_*, read the same counts)."""

from __future__ import annotations

from typing import Any

from gpumgr.extender.cluster import ClusterView

ONE, THREE = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def pod(uid: str, node: str, asks: dict[str, int], phase: str = "Running") -> dict[str, Any]:
    limits = {r: str(n) for r, n in asks.items()}
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ml"}, "status": {"phase": phase},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]}}


def test_counts_of_pods_that_are_gone_leave_no_entry():
    view = ClusterView()
    for i in range(50):  # pods come and go over many nodes
        view.set_pod(pod(f"a{i}", f"node-{i}", {ONE: 2}))
        view.set_pod(pod(f"b{i}", f"node-{i}", {ONE: 1, THREE: 1}))
    assert view.mig_in_use()["node-7"] == {ONE: 3, THREE: 1}
    for i in range(50):
        view.remove_pod(pod(f"a{i}", f"node-{i}", {}))
        view.set_pod(pod(f"b{i}", f"node-{i}", {ONE: 1, THREE: 1}, phase="Succeeded"))  # finished: holds nothing
    assert view.mig_in_use() == {}  # before: 50 nodes of {ONE: 0, THREE: 0}

    view.set_pod(pod("c", "node-1", {THREE: 1}))
    view.set_pod(pod("d", "node-1", {ONE: 1}))
    view.remove_pod(pod("d", "node-1", {}))
    assert view.mig_in_use() == {"node-1": {THREE: 1}}
    view.replace_pods([])  # a re-list with none of them
    assert view.mig_in_use() == {}
