"""Cases found in review: a bind whose answer was lost, hostile quantities, calls before the first sync."""

from __future__ import annotations

import pytest

from gpumgr.extender.ask import pod_ask
from gpumgr.extender.cluster import ClusterView
from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender import support as s


def test_a_bound_pod_counts_even_when_its_bind_was_thought_to_have_failed():
    """The Binding was made but its answer was lost: the extender forgot its assumption and voided that bind's
    annotations. Once the watch shows the pod bound, its cards must count again."""
    view = ClusterView()
    inv = s.inventory(1)
    view.replace_nodes({"n1": s.node("n1", inv)["metadata"]["annotations"][podspec.ANN_NODE_INVENTORY]})
    held = s.holding("p", "n1", [(100, 0, [0])], bound=False)
    held["metadata"]["uid"] = "uid-p"
    held["metadata"]["annotations"][podspec.ANN_PREDICATE_TIME] = "42"
    view.replace_pods([])
    view.synced.update({"nodes", "pods"})
    view.forget("uid-p", "42")  # the failed bind, as the binder records it
    view.set_pod(held)  # the watch delivers the annotations of that bind: ignored while unbound
    other = s.pod("q")
    other["metadata"]["uid"] = "uid-q"
    assert view.verdict(pod_ask(other), "uid-q", "n1").ok
    held["spec"]["nodeName"] = "n1"  # ... then the pod shows up bound: the Binding had been made
    view.set_pod(held)
    assert not view.verdict(pod_ask(other), "uid-q", "n1").ok


@pytest.mark.parametrize("raw", ["1e5000", "1e-2000000", "1e15000000", "9" * 40, str(2**64), 2**64, -1])
def test_hostile_quantities_are_refused(raw):
    with pytest.raises(ValueError, match="out of range|not a"):  # before any huge big-number arithmetic
        podspec.quantity(raw)


async def test_filter_and_bind_wait_for_the_first_sync(api: KubeApiServer, start_extender):
    api.store.create_node(s.node("n1", s.inventory(1)))
    ext = await start_extender()
    ext.server.view.synced.discard("pods")  # as if the pod list were still loading
    p = s.pod("p")
    p["metadata"]["uid"] = "uid-p"
    doc = await ext.filter(s.args(p, ["n1"]))
    assert doc["NodeNames"] == [] and "still listing" in doc["FailedNodes"]["n1"]
    api.store.create_pod(s.pod("p"))
    assert "still listing" in await ext.bind(api.store.get_pod("default", "p"), "n1")
    ext.server.view.synced.add("pods")
    doc = await ext.filter(s.args(p, ["n1"]))
    assert doc["NodeNames"] == ["n1"]
