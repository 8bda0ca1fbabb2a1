"""The extender Deployment and its Service: flags of `gpumgr extender`, probes, replicas, reachability."""

from __future__ import annotations

from typing import Any

from .support import NAMESPACE, PREFIX, VARIANTS, container, flags, positional, render, selects

EXTENDER = f"{PREFIX}-extender"


def test_default_extender() -> None:
    rendered = render()
    deployment = rendered.get("Deployment", EXTENDER)
    c = container(deployment, "extender")
    assert deployment["spec"]["replicas"] == 2
    assert c["command"] == ["gpumgr"]
    assert positional(c["args"]) == ["extender"]
    assert flags(c["args"]) == {
        "listen": "0.0.0.0:3456",
        "url-prefix": "/gpumgr",
        "policy": "binpack",
        "log-level": "info",
        "scheduler-name": "gpumgr-scheduler",
        "max-body-bytes": "1048576",
        "probe-listen": "0.0.0.0:8081",
        "tls-cert-file": "/etc/gpumgr-extender/tls/tls.crt",
        "tls-key-file": "/etc/gpumgr-extender/tls/tls.key",
        "client-ca-file": "/etc/gpumgr-extender/tls/ca.crt",
        "leader-elect": None,
        "leader-elect-lease-name": EXTENDER,
        "leader-elect-namespace": NAMESPACE,
        "dra-claims": "off",  # agent.mode device-plugin: no claims to count, and no RBAC to read them
    }


def test_extender_only_mode_binds_pods_of_the_default_scheduler() -> None:
    c = container(render(VARIANTS["extender-only"]).get("Deployment", EXTENDER), "extender")
    assert flags(c["args"])["scheduler-name"] == "default-scheduler"


def test_spread_policy_and_replicas() -> None:
    deployment = render(VARIANTS["spread"]).get("Deployment", EXTENDER)
    assert deployment["spec"]["replicas"] == 2
    assert flags(container(deployment, "extender")["args"])["policy"] == "spread"


def test_probes_use_the_plain_probe_port() -> None:
    c = container(render({"extender": {"probePort": 9090}}).get("Deployment", EXTENDER), "extender")
    assert c["ports"] == [
        {"name": "https", "containerPort": 3456, "protocol": "TCP"},
        {"name": "probes", "containerPort": 9090, "protocol": "TCP"},
    ]
    assert flags(c["args"])["probe-listen"] == "0.0.0.0:9090"
    # the kubelet has no client certificate: probes go to the plain-HTTP probe listener, never to the API port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}


def test_extender_runs_unprivileged() -> None:
    deployment = render().get("Deployment", EXTENDER)
    security = container(deployment, "extender")["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    pod = deployment["spec"]["template"]["spec"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork")
    assert [v["name"] for v in pod["volumes"]] == ["tls"] and "hostPath" not in pod["volumes"][0]


def service_reaches_extender(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    rendered = render(values)
    service = rendered.get("Service", EXTENDER)
    deployment = rendered.get("Deployment", EXTENDER)
    # the elected leader's pod: it adds this label to itself (gpumgr.extender.leaderlabel)
    leader_labels = {**deployment["spec"]["template"]["metadata"]["labels"], "gpumgr.io/extender-leader": "true"}
    assert selects(service["spec"]["selector"], leader_labels)
    assert not selects(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    other_pods = [o for o in rendered.objects if o["kind"] in {"DaemonSet", "Deployment"} and o is not deployment]
    for other in other_pods:
        assert not selects(service["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"])
    return service, deployment


def test_service_routes_port_3456_to_the_extender_only() -> None:
    service, deployment = service_reaches_extender({})
    assert service["spec"]["type"] == "ClusterIP"
    (port,) = service["spec"]["ports"]  # the probe port is not behind the Service
    container_ports = {p["name"]: p["containerPort"] for p in container(deployment, "extender")["ports"]}
    assert port["port"] == 3456
    assert container_ports[port["targetPort"]] == 3456


def test_custom_port_and_prefix_follow_through() -> None:
    values = {"extender": {"port": 8888, "urlPrefix": "/sched/gpu"}}
    service, deployment = service_reaches_extender(values)
    args = flags(container(deployment, "extender")["args"])
    assert args["listen"] == "0.0.0.0:8888"
    assert args["url-prefix"] == "/sched/gpu"
    assert service["spec"]["ports"][0]["port"] == 8888


def test_node_port_service() -> None:
    service, _ = service_reaches_extender(VARIANTS["operator-extras"])
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"][0]["nodePort"] == 31456


def test_extender_placement() -> None:
    pod = render(VARIANTS["custom-placement"]).get("Deployment", EXTENDER)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}


def test_the_extender_counts_dra_claims_only_where_the_agent_serves_them() -> None:
    for variant in ("dra", "both"):
        c = container(render(VARIANTS[variant]).get("Deployment", EXTENDER), "extender")
        assert flags(c["args"])["dra-claims"] == "on", variant
