"""A second real node (its own kubelet and agent in its own mount namespace): both kubelets see their own
/var/lib/kubelet/device-plugins, both nodes get capacity, and the extender places pods on the one asked for."""

from __future__ import annotations

from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import CARDS, NODE, NODE_LABELS, Env
from tests.realk8s.procs import wait_for

SECOND = "gpu-node-2"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def second(realk8s: Env) -> Any:
    node = realk8s.cluster.add_node(SECOND, labels=NODE_LABELS)
    realk8s.gpumgr.start_agent(node, realk8s.spec)
    core = realk8s.core()
    w.ensure_namespace(core)
    yield node
    w.delete_all(core)
    node.stop()
    del realk8s.cluster.nodes[SECOND]
    core.delete_node(SECOND)
    wait_for("the second node gone", lambda: SECOND not in [n.metadata.name for n in core.list_node().items], 60)
    del realk8s.gpumgr.agents[SECOND]


def test_second_node_has_its_own_plugins_and_runs_pods(realk8s: Env, second: Any) -> None:
    core = realk8s.core()

    def cap(name: str) -> str | None:
        return (core.read_node(name).status.capacity or {}).get(w.CORE)

    wait_for("capacity on the second node", lambda: cap(SECOND) == str(100 * CARDS), 120, interval_s=0.5)
    assert cap(NODE) == str(100 * CARDS)
    # each kubelet's device-plugin directory is its own: two kubelet.sock files, two sets of plugin sockets
    first_dir, second_dir = realk8s.node.device_plugin_dir, second.device_plugin_dir
    assert (first_dir / "kubelet.sock").exists() and (second_dir / "kubelet.sock").exists()
    assert sorted(p.name for p in second_dir.glob("v*.sock")) == sorted(p.name for p in first_dir.glob("v*.sock"))
    body = w.gpu_pod("on-second", cores=100)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": SECOND}
    w.create(core, body)
    pod = w.wait_running(core, "on-second")
    assert pod.spec.node_name == SECOND
    assert w.record_for(second, pod, "cuda0")["envs"]["NVIDIA_VISIBLE_DEVICES"]
    assert not [r for r in realk8s.node.records() if r["pod"]["uid"] == pod.metadata.uid]
