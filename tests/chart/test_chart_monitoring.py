"""The Grafana dashboard and the PrometheusRule: every PromQL expression parses and names only series that a real
agent's /metric serves (scraped over HTTP from a simulated node), and the rules pass `promtool check rules`."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from tests.metrics.node import SimNode
from tests.metrics.scrape import get, serving

from .support import CHART_DIR, NAMESPACE, PREFIX, VARIANTS, Rendered, render

DASHBOARD = f"{PREFIX}-dashboard"
# Series no agent serves that the rules may name: Prometheus' own per-target `up`.
PROMETHEUS_SERIES = {"up"}


async def scrape_names(tmp: Path) -> set[str]:
    """Names of every series /metric serves once each kind of event has happened on the node."""
    node = SimNode(tmp)
    await node.place("train", "main", (0,), 30, 4096, pids=[4211])
    await node.place("big", "worker", (2, 3), 200, 32768, pids=[4300])
    node.metrics.observe_allocate(0.002, ok=True)
    node.metrics.observe_allocate(0.004, ok=False, reason="no_fit")
    node.metrics.reregistration("vcuda-core")
    node.metrics.vdevice_registration()
    node.metrics.health_transition(1, False, "xid")
    node.metrics.xid_error(1, 79)
    async with serving(node) as server:
        status, _, text = await get(server.url + "/metric")
    assert status == 200, text
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    names = asyncio.run(scrape_names(tmp_path_factory.mktemp("node")))
    assert "container_gpu_utilization" in names and "gpumgr_allocate_duration_seconds_bucket" in names
    return names


def selectors(node: Any) -> Iterator[str]:
    """Metric names of every vector selector in a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        for matcher in node.matchers.matchers:
            if matcher.name == "__name__":
                yield matcher.value
        return
    if isinstance(node, promql_parser.MatrixSelector):
        yield from selectors(node.vector_selector)
        return
    for attribute in ("lhs", "rhs", "expr", "param"):
        child = getattr(node, attribute, None)
        if child is not None:
            yield from selectors(child)
    for arg in getattr(node, "args", None) or []:
        yield from selectors(arg)


def metric_names(expression: str) -> set[str]:
    try:
        parsed = promql_parser.parse(expression)
    except ValueError as error:
        raise AssertionError(f"PromQL does not parse: {expression}: {error}") from None
    return set(selectors(parsed))


def rules(rendered: Rendered) -> list[dict[str, Any]]:
    (rule,) = rendered.all("PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard(rendered: Rendered) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(rendered.get("ConfigMap", DASHBOARD)["data"]["gpumgr.json"])
    return data


def dashboard_targets(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def test_name_check_can_fail() -> None:
    assert metric_names('sum by (gpu) (rate(gpumgr_nope_total{gpu="gpu0"}[5m])) / on (gpu) up') == {
        "gpumgr_nope_total",
        "up",
    }
    with pytest.raises(AssertionError, match="does not parse"):
        metric_names("sum by (gpu (gpumgr_gpu_healthy)")


def test_dashboard_ships_as_a_sidecar_config_map() -> None:
    rendered = render()
    config_map = rendered.get("ConfigMap", DASHBOARD)
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART_DIR / "dashboards" / "gpumgr.json").read_text()
    assert config_map["data"]["gpumgr.json"] == shipped
    assert render({"monitoring": {"dashboard": {"enabled": False}}}).all("ConfigMap") != rendered.all("ConfigMap")


def test_every_dashboard_query_names_served_metrics(served: set[str]) -> None:
    board = dashboard(render())
    targets = dashboard_targets(board)
    assert len(targets) >= 20
    for title, expression in targets:
        names = metric_names(expression)
        assert names, f"{title}: {expression} names no metric"
        assert names <= served, f"{title}: {sorted(names - served)} not served by /metric"
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            metric = variable["query"]["query"].removeprefix("label_values(").split(",")[0]
            assert metric in served, variable["name"]


def test_dashboard_covers_what_operators_watch() -> None:
    used = {name for _, expression in dashboard_targets(dashboard(render())) for name in metric_names(expression)}
    wanted = {
        "gpumgr_gpu_allocated_cores",  # allocation vs usage, per node and per card
        "gpumgr_gpu_utilization_percent",
        "gpumgr_gpu_allocated_memory_bytes",
        "gpumgr_gpu_used_memory_bytes",
        "container_gpu_utilization",  # per-container usage vs limits
        "container_request_gpu_utilization",
        "container_gpu_memory_total",
        "container_request_gpu_memory",
        "gpumgr_gpu_healthy",  # health
        "gpumgr_gpu_xid_errors_total",
        "gpumgr_allocate_duration_seconds_bucket",  # agent latency
    }
    assert wanted <= used


def test_dashboard_panels_are_well_formed() -> None:
    board = dashboard(render())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))


def test_no_prometheus_rule_by_default() -> None:
    assert render().all("PrometheusRule") == []


def test_rules_name_only_served_metrics(served: set[str]) -> None:
    rendered = render(VARIANTS["prometheus-rule"])
    (rule,) = rendered.all("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = rules(rendered)
    assert len(alerts) >= 10
    for alert in alerts:
        names = metric_names(alert["expr"])
        assert names <= served | PROMETHEUS_SERIES, f"{alert['alert']}: {sorted(names - served)} not served"
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}
        assert alert["annotations"]["summary"]


def test_agent_down_alert_uses_the_scrape_job() -> None:
    values = {"monitoring": {"prometheusRule": {"enabled": True, "agentJob": "gpu-agents"}}}
    (down,) = [r for r in rules(render(values)) if r["alert"] == "GPUAgentDown"]
    assert down["expr"] == 'up{job="gpu-agents"} == 0'
    # the default is the job the chart's ServiceMonitor produces (its jobLabel, app.kubernetes.io/name)
    rendered = render({**VARIANTS["prometheus-rule"], **VARIANTS["service-monitor"]})
    (monitor,) = rendered.all("ServiceMonitor")
    service = rendered.get("Service", f"{PREFIX}-metrics")
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    (down,) = [r for r in rules(rendered) if r["alert"] == "GPUAgentDown"]
    assert down["expr"] == f'up{{job="{job}"}} == 0'


def test_rules_in_the_docs_are_the_shipped_rules() -> None:
    doc = (CHART_DIR.parents[1] / "docs" / "metrics.md").read_text()
    shipped = {r["alert"] for r in rules(render(VARIANTS["prometheus-rule"]))}
    for name in shipped:
        assert f"`{name}`" in doc, f"alert {name} is not described in docs/metrics.md"


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_rules_pass_promtool(tmp_path: Path) -> None:
    (rule,) = render(VARIANTS["prometheus-rule"]).all("PrometheusRule")
    file = tmp_path / "rules.yaml"
    file.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout + result.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_check_can_fail(tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum by (x (y)"}]}]}))
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(file)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_agent_down_alert_follows_name_override() -> None:
    # the ServiceMonitor's job is app.kubernetes.io/name, which nameOverride changes: the alert must follow it
    values = {**VARIANTS["prometheus-rule"], **VARIANTS["service-monitor"], "nameOverride": "vgpu"}
    rendered = render(values)
    (monitor,) = rendered.all("ServiceMonitor")
    (service,) = [s for s in rendered.all("Service") if s["metadata"]["name"].endswith("-metrics")]
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert job == "vgpu"
    (down,) = [r for r in rules(rendered) if r["alert"] == "GPUAgentDown"]
    assert down["expr"] == 'up{job="vgpu"} == 0'
