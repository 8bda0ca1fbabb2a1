"""The agent's ValidatingAdmissionPolicy: a node's agent changes only its own node's objects, and only gpumgr's own
fields of them. Every expression is evaluated with cel-python against admission requests as the API server
builds them (own node allowed, other node denied)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .cel_support import admission_request, run_policy
from .support import NAMESPACE, PREFIX, Rendered, render

AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-agent"
POLICY = f"{PREFIX}-agent-node-restriction"
ME, OTHER = "gpu-node-1", "gpu-node-2"


def policy(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return render(values).get("ValidatingAdmissionPolicy", POLICY)


def a_pod(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"app": "train"},
            "annotations": {"team": "ml", "tencent.com/predicate-node": node},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u1"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "cuda", "image": "cuda:12"}]},
    }


def a_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpumgr.io/gpu-count": "4"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    }


def changed(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    node = new
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return new


def update(
    pol: dict[str, Any],
    resource: str,
    old: dict[str, Any],
    new: dict[str, Any],
    node: str | None = ME,
    user: str = AGENT_USER,
    sub_resource: str = "",
    group: str = "",
) -> Any:
    request = admission_request(user, "UPDATE", resource, group=group, sub_resource=sub_resource, node=node)
    return run_policy(pol, request, new, old)


GPU_ANNOTATION = ("metadata", "annotations", "tencent.com/vcuda-core-limit")


def test_default_is_the_node_restriction_with_a_binding() -> None:
    rendered = render()
    pol = rendered.get("ValidatingAdmissionPolicy", POLICY)
    assert pol["metadata"]["annotations"]["gpumgr.io/node-restriction"] == "node"
    assert pol["spec"]["failurePolicy"] == "Fail"
    binding = rendered.get("ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}


def test_agent_may_annotate_pods_of_its_own_node() -> None:
    pod = a_pod(ME)
    verdict = update(policy(), "pods", pod, changed(pod, GPU_ANNOTATION, "30"))
    assert verdict.matched and verdict.allowed, verdict.denied


def test_agent_may_not_touch_pods_of_another_node() -> None:
    pod = a_pod(OTHER)
    verdict = update(policy(), "pods", pod, changed(pod, GPU_ANNOTATION, "30"))
    assert verdict.denied == [f"the gpumgr agent of node {ME} may only change pods bound to that node"]


def test_a_token_not_bound_to_a_node_is_refused() -> None:
    pod = a_pod(ME)
    verdict = update(policy(), "pods", pod, changed(pod, GPU_ANNOTATION, "30"), node=None)
    assert verdict.denied and "not bound to a node" in verdict.denied[0]


def test_agent_may_label_its_own_node_only() -> None:
    pol = policy()
    mine, other = a_node(ME), a_node(OTHER)
    label = ("metadata", "labels", "gpumgr.io/gpu-model")
    assert update(pol, "nodes", mine, changed(mine, label, "A100")).allowed
    denied = update(pol, "nodes", other, changed(other, label, "A100")).denied
    assert denied == [f"the gpumgr agent of node {ME} may only change its own Node"]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spec", "containers"), [{"name": "cuda", "image": "evil:latest"}], "spec"),
        (("metadata", "labels", "app"), "other", "labels of a pod"),
        (("metadata", "annotations", "team"), "other", "annotations under"),
        (("metadata", "annotations", "team"), None, "annotations under"),
        (("metadata", "annotations", "example.com/x"), "1", "annotations under"),
        (("metadata", "ownerReferences"), None, "owners or finalizers"),
        (("metadata", "finalizers"), ["example.com/block"], "owners or finalizers"),
    ],
    ids=["image", "label", "foreign-annotation", "removed-annotation", "new-annotation", "owners", "finalizers"],
)
def test_agent_changes_only_gpumgr_fields_of_its_pods(path: tuple[str, ...], value: Any, message: str) -> None:
    pod = a_pod(ME)
    verdict = update(policy(), "pods", pod, changed(pod, path, value))
    assert len(verdict.denied) == 1 and message in verdict.denied[0], verdict.denied


LABELS_MESSAGE = "node labels under gpumgr.io/ and gaia.tencent.com/gpu-model"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spec", "taints"), [], "spec"),
        (("spec", "unschedulable"), True, "spec"),
        (("metadata", "labels", "kubernetes.io/hostname"), "x", LABELS_MESSAGE),
        (("metadata", "labels", "node-role.kubernetes.io/control-plane"), "", LABELS_MESSAGE),
    ],
    ids=["taints", "cordon", "hostname-label", "role-label"],
)
def test_agent_changes_only_gpumgr_fields_of_its_node(path: tuple[str, ...], value: Any, message: str) -> None:
    node = a_node(ME)
    verdict = update(policy(), "nodes", node, changed(node, path, value))
    assert len(verdict.denied) == 1 and message in verdict.denied[0], verdict.denied


def test_label_prefix_follows_the_value() -> None:
    pol = policy({"agent": {"labelPrefix": "gpu.example.com/"}})
    node = a_node(ME)
    assert update(pol, "nodes", node, changed(node, ("metadata", "labels", "gpu.example.com/model"), "A100")).allowed
    assert not update(pol, "nodes", node, changed(node, ("metadata", "labels", "gpumgr.io/model"), "A100")).allowed


def test_other_users_are_not_concerned() -> None:
    pod = a_pod(OTHER)
    verdict = update(
        policy(),
        "pods",
        pod,
        changed(pod, ("spec", "containers"), []),
        node=None,
        user="system:serviceaccount:kube-system:replicaset-controller",
    )
    assert not verdict.matched


def test_fields_mode_is_the_fallback_without_node_identity() -> None:
    pol = policy({"agent": {"nodeRestriction": "fields"}})
    assert pol["metadata"]["annotations"]["gpumgr.io/node-restriction"] == "fields"
    pod = a_pod(OTHER)
    # without a node in the token, any node's pods may be annotated (what RBAC allows)...
    assert update(pol, "pods", pod, changed(pod, GPU_ANNOTATION, "30"), node=None).allowed
    # ...but never more than gpumgr's own fields
    assert not update(pol, "pods", pod, changed(pod, ("spec", "containers"), []), node=None).allowed
    assert not any("node" in v["expression"] and "nodeName ==" in v["expression"] for v in pol["spec"]["validations"])


def test_off_renders_no_policy() -> None:
    rendered = render({"agent": {"nodeRestriction": "off"}})
    assert rendered.all("ValidatingAdmissionPolicy") == rendered.all("ValidatingAdmissionPolicyBinding") == []


def slice_of(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-vgpu.gpumgr.io"},
        "spec": {
            "driver": "vgpu.gpumgr.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        },
    }


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_dra_slices_of_its_own_node_only(operation: str) -> None:
    pol = policy({"agent": {"mode": "dra"}})
    for node, allowed in ((ME, True), (OTHER, False)):
        obj = None if operation == "DELETE" else slice_of(node)
        old = None if operation == "CREATE" else slice_of(node)
        request = admission_request(AGENT_USER, operation, "resourceslices", group="resource.k8s.io", node=ME)
        verdict = run_policy(pol, request, obj, old)
        assert verdict.matched and verdict.allowed is allowed, (node, verdict.denied)


def mutating_grants(rendered: Rendered) -> set[tuple[str, str, str]]:
    role = rendered.get("ClusterRole", f"{PREFIX}-agent")
    verbs = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
    return {
        (group, resource, verbs[verb])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if verb in verbs and resource != "events"
    }


@pytest.mark.parametrize("mode", ["device-plugin", "both"])
def test_policy_covers_every_change_rbac_grants_the_agent(mode: str) -> None:
    rendered = render({"agent": {"mode": mode}})
    rules = rendered.get("ValidatingAdmissionPolicy", POLICY)["spec"]["matchConstraints"]["resourceRules"]
    covered = {
        (group, resource, operation)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for operation in rule["operations"]
    }
    assert mutating_grants(rendered) <= covered


def test_agent_may_write_every_node_label_it_owns_in_one_patch() -> None:
    # The agent sends its labels in one merge patch: gpumgr.io/ ones and gpu-manager's gaia.tencent.com/gpu-model.
    # The policy used to allow only the prefix, so the real API server refused the whole patch at every start.
    from gpumgr.node.labels import GAIA_MODEL_LABEL

    node = a_node(ME)
    both = changed(changed(node, ("metadata", "labels", "gpumgr.io/gpu.model"), "NVIDIA-A30"),
                   ("metadata", "labels", GAIA_MODEL_LABEL), "A30")
    assert update(policy(), "nodes", node, both).allowed
    other = changed(node, ("metadata", "labels", "gaia.tencent.com/other"), "x")
    assert not update(policy(), "nodes", node, other).allowed
