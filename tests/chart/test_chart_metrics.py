"""The agent's metrics Service (annotation discovery) and the optional ServiceMonitor."""

from __future__ import annotations

import re

from .support import NAMESPACE, PREFIX, VARIANTS, container, render, selects

METRICS = f"{PREFIX}-metrics"
DURATION = re.compile(r"^(\d+(\.\d+)?(ms|s|m|h))+$")


def test_metrics_service_is_annotated_for_prometheus() -> None:
    rendered = render()
    service = rendered.get("Service", METRICS)
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "5678",
        "prometheus.io/path": "/metric",
    }
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"]) == ("metrics", 5678)
    agent = rendered.get("DaemonSet", f"{PREFIX}-agent")
    assert selects(service["spec"]["selector"], agent["spec"]["template"]["metadata"]["labels"])
    agent_ports = {p["name"]: p["containerPort"] for p in container(agent, "agent")["ports"]}
    assert agent_ports[port["targetPort"]] == 5678
    extender = rendered.get("Deployment", f"{PREFIX}-extender")
    assert not selects(service["spec"]["selector"], extender["spec"]["template"]["metadata"]["labels"])


def test_metrics_port_follows_the_value() -> None:
    service = render({"metrics": {"port": 9400}}).get("Service", METRICS)
    assert service["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    assert service["spec"]["ports"][0]["port"] == 9400


def test_metrics_service_can_be_disabled() -> None:
    rendered = render({"metrics": {"service": {"enabled": False}}})
    assert METRICS not in [s["metadata"]["name"] for s in rendered.all("Service")]


def test_no_service_monitor_by_default() -> None:
    assert render().all("ServiceMonitor") == []


def test_service_monitor_scrapes_metric_on_the_metrics_service() -> None:
    rendered = render(VARIANTS["service-monitor"])
    (monitor,) = rendered.all("ServiceMonitor")
    service = rendered.get("Service", METRICS)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    spec = monitor["spec"]
    assert set(spec) == {"jobLabel", "namespaceSelector", "selector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert set(spec["selector"]) == {"matchLabels"}
    assert selects(spec["selector"]["matchLabels"], service["metadata"]["labels"])
    extender_service = rendered.get("Service", f"{PREFIX}-extender")
    assert not selects(spec["selector"]["matchLabels"], extender_service["metadata"]["labels"])
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metric"
    assert endpoint["scheme"] == "http"
    assert endpoint["honorLabels"] is False
    assert DURATION.match(endpoint["interval"]) and DURATION.match(endpoint["scrapeTimeout"])
    assert "relabelings" not in endpoint


def test_service_monitor_relabelings() -> None:
    relabel = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}
    values = {"metrics": {"serviceMonitor": {"enabled": True, "relabelings": [relabel], "interval": "15s"}}}
    (monitor,) = render(values).all("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["relabelings"] == [relabel]
    assert endpoint["interval"] == "15s"
