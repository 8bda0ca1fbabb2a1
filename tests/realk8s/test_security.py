"""What the chart's RBAC and ValidatingAdmissionPolicy let each component do, decided by a real API server, with the
very tokens the components run with (TokenRequest for their ServiceAccounts; the agent's bound to its Node)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import NODE, Env
from tests.realk8s.procs import wait_for

OTHER_NODE = "other-node"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def other_node(realk8s: Env) -> str:
    from kubernetes import client as k

    core = realk8s.core()
    try:
        core.read_node(OTHER_NODE)
    except k.ApiException:
        realk8s.cluster.add_fake_nodes([OTHER_NODE], {"cpu": "4", "memory": "8Gi", "pods": "10"})
    return OTHER_NODE


def agent_api(realk8s: Env) -> Any:
    from kubernetes import client as k

    kubeconfig = realk8s.gpumgr.workdir / f"agent-{NODE}.kubeconfig"
    return k.CoreV1Api(realk8s.cluster.client(kubeconfig))


def refusal(call: Any) -> tuple[int, str]:
    from kubernetes import client as k

    try:
        call()
    except k.ApiException as error:
        return int(error.status), str(error.body)
    raise AssertionError("the API server allowed it")


def test_agent_sets_its_node_labels(realk8s: Env) -> None:
    # The agent writes gaia.tencent.com/gpu-model with its gpumgr.io/ labels in one patch; the policy refused the
    # whole patch (422) before it allowed that label, and no label was ever set.
    def labelled() -> dict[str, str] | None:
        labels = realk8s.core().read_node(NODE).metadata.labels or {}
        return labels if labels.get("gpumgr.io/gpu") == "true" else None

    labels = wait_for("the agent's labels on its node", labelled, 60)
    assert isinstance(labels, dict)
    assert labels["gpumgr.io/gpu.count"] == "4"
    assert labels["gpumgr.io/gpu.model"] == "NVIDIA-A30"
    assert labels["gaia.tencent.com/gpu-model"] == "A30"


def test_agent_may_annotate_pods_of_its_node_only(realk8s: Env, core: Any, other_node: str) -> None:
    agent = agent_api(realk8s)
    w.create(core, w.plain_pod("mine", nodeName=NODE))
    w.create(core, w.plain_pod("theirs", nodeName=other_node))
    agent.patch_namespaced_pod("mine", w.NAMESPACE, {"metadata": {"annotations": {"gpumgr.io/test": "1"}}})
    # Refused with the policy's own message: before the policy tested has(request.subResource), the real API server
    # (which leaves subResource out) refused with a 422 evaluation error "no such key: subResource" instead.
    status, body = refusal(lambda: agent.patch_namespaced_pod(
        "theirs", w.NAMESPACE, {"metadata": {"annotations": {"gpumgr.io/test": "1"}}}))
    assert status in (403, 422)
    assert "may only change pods bound to that node" in body, body
    status, body = refusal(lambda: agent.patch_namespaced_pod(
        "mine", w.NAMESPACE, {"metadata": {"labels": {"app": "x"}}}))
    assert "may not change the labels of a pod" in body, body


def test_agent_may_change_only_its_own_node(realk8s: Env, other_node: str) -> None:
    agent = agent_api(realk8s)
    status, body = refusal(lambda: agent.patch_node(other_node, {"metadata": {"labels": {"gpumgr.io/x": "1"}}}))
    assert "may only change its own Node" in body, body
    status, body = refusal(lambda: agent.patch_node(NODE, {"metadata": {"labels": {"team": "x"}}}))
    assert "may only change node labels under gpumgr.io/" in body, body
    agent.patch_node(NODE, {"metadata": {"annotations": {"gpumgr.io/test": "1"}}})


def test_agent_and_extender_cannot_read_secrets(realk8s: Env) -> None:
    from kubernetes import client as k

    for component, node in (("agent", NODE), ("extender", None)):
        suffix = f"-{node}" if node else ""
        api = k.CoreV1Api(realk8s.cluster.client(realk8s.gpumgr.workdir / f"{component}{suffix}.kubeconfig"))
        status, _ = refusal(lambda api=api: api.list_namespaced_secret("gpu-system"))
        assert status == 403, component


def test_extender_refuses_callers_without_a_client_certificate(realk8s: Env) -> None:
    url = f"https://127.0.0.1:{realk8s.gpumgr.extender_port}/gpumgr/filter"
    context = ssl.create_default_context(cafile=str(realk8s.gpumgr.secret_file(
        realk8s.gpumgr.rendered_tls_secret("extender"), "ca.crt")))
    context.check_hostname = False
    assert_refused_before_http(url, context)


def assert_refused_before_http(url: str, context: ssl.SSLContext) -> None:
    """The TLS handshake is refused: no HTTP answer at all (an HTTP error such as 400 would mean it was served)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), context=context, timeout=5)
    except urllib.error.HTTPError as served:
        raise AssertionError(f"{url} served the caller: HTTP {served.code}") from None
    except (ssl.SSLError, urllib.error.URLError, ConnectionError):
        return
    raise AssertionError(f"{url} served the caller")


def test_webhook_refuses_callers_without_a_client_certificate(realk8s: Env, tmp_path: Any) -> None:
    # the API server's own calls (with its client certificate) are accepted: tests/realk8s/test_webhook.py
    from tests.realk8s import pki

    gpumgr = realk8s.gpumgr
    url = f"https://127.0.0.1:{gpumgr.webhook_port}/mutate"
    stranger = pki.Authority(tmp_path / "stranger", "stranger-ca").issue("stranger", "kube-apiserver-webhook-client")
    for client in (None, stranger):
        context = ssl.create_default_context(cafile=str(gpumgr.webhook_ca.ca_file))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
        assert_refused_before_http(url, context)
    # the kubelet's probes need no certificate: the probe port serves /healthz and nothing else
    probe = f"http://127.0.0.1:{gpumgr.webhook_probe_port}"
    with urllib.request.urlopen(f"{probe}/healthz", timeout=5) as r:
        assert r.status == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{probe}/mutate", data=b"{}", method="POST"), timeout=5)
    assert refused.value.code == 404


def test_extender_may_only_write_gpumgr_annotations_on_pods(realk8s: Env, core: Any) -> None:
    # RBAC lets the extender patch any pod; the chart's extender policy keeps it to what it writes.
    from kubernetes import client as k

    extender = k.CoreV1Api(realk8s.cluster.client(realk8s.gpumgr.workdir / "extender.kubeconfig"))
    w.create(core, w.plain_pod("target"))
    extender.patch_namespaced_pod("target", w.NAMESPACE, {"metadata": {"annotations": {"gpumgr.io/test": "1"}}})
    _, body = refusal(lambda: extender.patch_namespaced_pod(
        "target", w.NAMESPACE, {"metadata": {"labels": {"app": "x"}}}))
    assert "may only change the label gpumgr.io/extender-leader" in body, body
    _, body = refusal(lambda: extender.patch_namespaced_pod(
        "target", w.NAMESPACE, {"metadata": {"annotations": {"team": "x"}}}))
    assert "may only change pod annotations under" in body, body
