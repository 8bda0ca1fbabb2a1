"""RBAC: one ServiceAccount per component, each with exactly the permissions it uses."""

from __future__ import annotations

from typing import Any

import pytest

from .support import NAMESPACE, PREFIX, VARIANTS, Rendered, render

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    out: set[Grant] = set()
    for rule in rules:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def expand(spec: dict[str, str]) -> set[Grant]:
    return {("", resource, verb) for resource, verbs in spec.items() for verb in verbs.split()}


AGENT = expand(
    {
        "pods": "get list watch patch",
        "nodes": "get patch",
        "events": "create patch",
    }
)
EXTENDER = expand(
    {
        "pods": "get list watch patch",
        "pods/binding": "create",
        "nodes": "get list watch",
    }
)


def bound_subjects(rendered: Rendered, kind: str, role_kind: str, role: str) -> list[dict[str, Any]]:
    return [
        subject
        for binding in rendered.all(kind)
        if binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}
        for subject in binding["subjects"]
    ]


def service_account_of(rendered: Rendered, kind: str, name: str) -> dict[str, str]:
    sa: str = rendered.get(kind, name)["spec"]["template"]["spec"]["serviceAccountName"]
    assert rendered.get("ServiceAccount", sa)["metadata"]["namespace"] == NAMESPACE
    return {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}


@pytest.mark.parametrize(
    ("component", "workload_kind", "expected"),
    [("agent", "DaemonSet", AGENT), ("extender", "Deployment", EXTENDER)],
)
def test_component_has_exactly_its_permissions(component: str, workload_kind: str, expected: set[Grant]) -> None:
    rendered = render()
    name = f"{PREFIX}-{component}"
    assert grants(rendered.get("ClusterRole", name)["rules"]) == expected
    subject = service_account_of(rendered, workload_kind, name)
    assert bound_subjects(rendered, "ClusterRoleBinding", "ClusterRole", name) == [subject]


def test_each_component_has_its_own_service_account() -> None:
    rendered = render()
    accounts = [
        service_account_of(rendered, kind, f"{PREFIX}-{component}")["name"]
        for kind, component in [("DaemonSet", "agent"), ("Deployment", "extender"), ("Deployment", "scheduler")]
    ]
    assert len(set(accounts)) == 3
    assert len(rendered.all("ServiceAccount")) == 3


def test_no_wildcards_and_no_secrets_anywhere() -> None:
    for values in VARIANTS.values():
        rendered = render(values)
        for role in rendered.all("ClusterRole") + rendered.all("Role"):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
                assert "secrets" not in rule["resources"]


def test_scheduler_gets_the_standard_scheduler_roles() -> None:
    rendered = render()
    subject = service_account_of(rendered, "Deployment", f"{PREFIX}-scheduler")
    for role in ("system:kube-scheduler", "system:volume-scheduler"):
        assert bound_subjects(rendered, "ClusterRoleBinding", "ClusterRole", role) == [subject]
    reader = bound_subjects(rendered, "RoleBinding", "Role", "extension-apiserver-authentication-reader")
    assert reader == [subject]


def test_scheduler_may_only_hold_its_own_lease() -> None:
    rendered = render({"scheduler": {"name": "gpu-scheduler"}})
    role = rendered.get("Role", f"{PREFIX}-scheduler-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gpu-scheduler"],
            "verbs": ["get", "update"],
        },
    ]
    subject = service_account_of(rendered, "Deployment", f"{PREFIX}-scheduler")
    assert bound_subjects(rendered, "RoleBinding", "Role", role["metadata"]["name"]) == [subject]


def test_extender_only_mode_grants_nothing_to_a_scheduler() -> None:
    rendered = render(VARIANTS["extender-only"])
    assert not bound_subjects(rendered, "ClusterRoleBinding", "ClusterRole", "system:kube-scheduler")
    assert [r["metadata"]["name"] for r in rendered.all("Role")] == [f"{PREFIX}-extender-leader-election"]
    assert len(rendered.all("ServiceAccount")) == 2


def test_rbac_and_service_accounts_can_be_left_to_the_operator() -> None:
    values = {
        "rbac": {"create": False},
        "agent": {"serviceAccount": {"create": False, "name": "my-agent"}},
        "extender": {"serviceAccount": {"create": False, "name": "my-extender"}},
        "scheduler": {"serviceAccount": {"create": False, "name": ""}},
    }
    rendered = render(values)
    kinds = {o["kind"] for o in rendered.objects}
    assert kinds.isdisjoint({"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})
    assert service_account_name(rendered, "DaemonSet", "agent") == "my-agent"
    assert service_account_name(rendered, "Deployment", "extender") == "my-extender"
    assert service_account_name(rendered, "Deployment", "scheduler") == "default"


def service_account_name(rendered: Rendered, kind: str, component: str) -> str:
    name: str = rendered.get(kind, f"{PREFIX}-{component}")["spec"]["template"]["spec"]["serviceAccountName"]
    return name


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_extender_reads_resource_claims_where_dra_is_on(mode: str) -> None:
    """In dra/both mode the extender counts allocated claims (--dra-claims auto): read-only, nothing more."""
    rules = render({"agent": {"mode": mode}}).get("ClusterRole", f"{PREFIX}-extender")["rules"]
    claims = {("resource.k8s.io", "resourceclaims", verb) for verb in ("get", "list", "watch")}
    assert grants(rules) == EXTENDER | claims
