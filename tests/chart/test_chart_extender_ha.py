"""Several extender replicas: leader election flags the binary accepts, the Lease RBAC, readiness, the PDB."""

from __future__ import annotations

import argparse

import pytest

from gpumgr.commands import extender as extender_command
from gpumgr.extender.leaderlabel import LEADER_LABEL
from gpumgr.extender.server import SETTLE_TIMEOUT

from .support import NAMESPACE, PREFIX, VARIANTS, container, render
from .test_chart_rbac import bound_subjects, service_account_of

EXTENDER = f"{PREFIX}-extender"
LEASE_ROLE = f"{EXTENDER}-leader-election"


def parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpumgr")
    extender_command.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(args)


@pytest.mark.parametrize("variant", ["default", "extender-ha", "extender-single", "insecure"])
def test_the_args_are_flags_of_gpumgr_extender_and_elect_the_chart_lease(variant: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = render(VARIANTS[variant]).get("Deployment", EXTENDER)
    c = container(deployment, "extender")
    assert c["env"][:2] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    assert c["env"][2:] == [{"name": "GPUMGR_MEMORY_LIMIT_BYTES",  # tests/chart/test_chart_body_budget.py
                             "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}]
    monkeypatch.setenv("POD_NAME", f"{EXTENDER}-7d9f-abcde")
    args = parse(c["args"])  # an unknown flag would exit here
    settings = extender_command._election(args)
    assert settings is not None
    assert (settings.namespace, settings.lease_name) == (NAMESPACE, EXTENDER)
    assert settings.identity.startswith(f"{EXTENDER}-7d9f-abcde_")
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (15, 10, 2)


def test_several_replicas_render_with_readiness_on_the_leader_and_a_disruption_budget() -> None:
    rendered = render(VARIANTS["extender-ha"])
    deployment = rendered.get("Deployment", EXTENDER)
    assert deployment["spec"]["replicas"] == 3
    c = container(deployment, "extender")
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    pdb = rendered.get("PodDisruptionBudget", EXTENDER)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("variant", ["default", "extender-ha", "extender-single", "insecure"])
def test_the_service_routes_to_the_leaders_label_and_every_synced_replica_is_ready(variant: str) -> None:
    rendered = render(VARIANTS[variant])
    deployment = rendered.get("Deployment", EXTENDER)
    service = rendered.get("Service", EXTENDER)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    # the pods match every label of the selector but the leader's, which only the leader sets on its own pod
    assert service["spec"]["selector"] == {**deployment["spec"]["selector"]["matchLabels"], LEADER_LABEL: "true"}
    assert LEADER_LABEL not in pod_labels
    c = container(deployment, "extender")
    # readiness is /readyz, which no longer depends on leadership: a standby is ready, so a rolling update
    # (a surge pod must become ready while the old leader still leads) and a drain under the PDB can finish
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert "leader" not in c["readinessProbe"]["httpGet"]["path"]
    strategy = deployment["spec"].get("strategy", {"type": "RollingUpdate"})
    assert strategy.get("type", "RollingUpdate") == "RollingUpdate"
    # the leader's RBAC allows labelling its pod (patch on pods) and finding a previous leader's (list)
    extender_role = rendered.get("ClusterRole", EXTENDER)
    pod_rule = next(r for r in extender_role["rules"] if r["resources"] == ["pods"])
    assert {"list", "patch"} <= set(pod_rule["verbs"])


def test_a_stopping_leader_has_time_for_its_binds_and_the_release() -> None:
    deployment = render(VARIANTS["extender-ha"]).get("Deployment", EXTENDER)
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 2 + SETTLE_TIMEOUT + 10


def test_replicas_spread_over_nodes_by_default_and_the_spread_can_be_replaced() -> None:
    deployment = render(VARIANTS["extender-ha"]).get("Deployment", EXTENDER)
    [spread] = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "x"}}}
    mine = render({"extender": {"topologySpreadConstraints": [zone]}}).get("Deployment", EXTENDER)
    assert mine["spec"]["template"]["spec"]["topologySpreadConstraints"] == [zone]
    off = render({"extender": {"spreadOverNodes": False}}).get("Deployment", EXTENDER)
    assert "topologySpreadConstraints" not in off["spec"]["template"]["spec"]


def test_a_single_replica_has_no_disruption_budget_but_still_elects() -> None:
    rendered = render(VARIANTS["extender-single"])
    assert rendered.all("PodDisruptionBudget") == []
    assert "--leader-elect" in container(rendered.get("Deployment", EXTENDER), "extender")["args"]


def test_the_extender_may_only_hold_its_own_lease() -> None:
    rendered = render(VARIANTS["extender-ha"])
    role = rendered.get("Role", LEASE_ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        # create cannot be restricted by resourceNames (RBAC does not know the name of an object being created)
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [EXTENDER],
         "verbs": ["get", "update"]},
    ]
    subject = service_account_of(rendered, "Deployment", EXTENDER)
    assert bound_subjects(rendered, "RoleBinding", "Role", LEASE_ROLE) == [subject]


def test_no_lease_rbac_when_rbac_is_left_to_the_operator() -> None:
    rendered = render({"rbac": {"create": False}, "extender": {"serviceAccount": {"create": False,
                                                                                  "name": "mine"}}})
    assert rendered.all("Role") == [] and rendered.all("RoleBinding") == []
