"""values.schema.json accepts the defaults and every variant, and rejects bad values with a clear error."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from .support import CHART_DIR, VARIANTS, render


def schema_error(values: dict[str, Any]) -> str:
    with helm.Chart.load(CHART_DIR) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    return str(caught.value)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_are_valid(variant: str) -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(VARIANTS[variant])


def test_values_yaml_itself_is_valid() -> None:
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(defaults)
        assert chart.values == defaults


# (values, the JSON pointer the error must name, a word the error must contain)
BAD_VALUES: list[tuple[dict[str, Any], str, str]] = [
    ({"extender": {"policy": "random"}}, "/extender/policy", "binpack"),
    ({"extender": {"replicas": "3"}}, "/extender/replicas", "integer"),
    ({"extender": {"replicas": 0}}, "/extender/replicas", "minimum"),
    ({"extender": {"replicas": 11}}, "/extender/replicas", "maximum"),
    ({"scheduler": {"mode": "second-scheduler"}}, "/scheduler/mode", "extender-only"),
    ({"scheduler": {"weight": 1.5}}, "/scheduler/weight", "integer"),
    ({"scheduler": {"clientConnection": {"qps": 0}}}, "/scheduler/clientConnection/qps", "exclusiveMinimum"),
    ({"scheduler": {"clientConnection": {"burst": 1.5}}}, "/scheduler/clientConnection/burst", "integer"),
    ({"scheduler": {"clientConnection": {"qps": "200"}}}, "/scheduler/clientConnection/qps", "number"),
    ({"scheduler": {"clientConnection": {"qps": 10001}}}, "/scheduler/clientConnection/qps", "maximum"),
    ({"scheduler": {"clientConnection": {"burst": 0}}}, "/scheduler/clientConnection/burst", "minimum"),
    ({"scheduler": {"clientConnection": {"burst": 20001}}}, "/scheduler/clientConnection/burst", "maximum"),
    ({"scheduler": {"clientConnection": {"kubeconfig": "/x"}}}, "/scheduler/clientConnection", "kubeconfig"),
    ({"scheduler": {"percentageOfNodesToScore": 101}}, "/scheduler/percentageOfNodesToScore", "maximum"),
    ({"scheduler": {"percentageOfNodesToScore": -1}}, "/scheduler/percentageOfNodesToScore", "minimum"),
    ({"scheduler": {"httpTimeout": "30 seconds"}}, "/scheduler/httpTimeout", "does not match"),
    ({"scheduler": {"extenderURL": "gpumgr-extender:3456"}}, "/scheduler/extenderURL", "does not match"),
    ({"agent": {"nodeselector": {"a": "b"}}}, "/agent", "nodeselector"),
    ({"agent": {"nodeSelector": {"nvidia.com/gpu.present": True}}}, "/agent/nodeSelector", "string"),
    ({"agent": {"tolerations": {"key": "nvidia.com/gpu"}}}, "/agent/tolerations", "array"),
    ({"agent": {"memoryUnitMiB": 0}}, "/agent/memoryUnitMiB", "minimum"),
    ({"agent": {"cdi": "yes"}}, "/agent/cdi", "boolean"),
    ({"agent": {"logLevel": "verbose"}}, "/agent/logLevel", "info"),
    ({"agent": {"paths": {"checkpointDir": "var/lib/gpumgr"}}}, "/agent/paths/checkpointDir", "does not match"),
    ({"agent": {"health": {"ignoreXids": "13,31"}}}, "/agent/health/ignoreXids", "array"),
    ({"metrics": {"port": 70000}}, "/metrics/port", "maximum"),
    ({"metrics": {"serviceMonitor": {"enabled": "true"}}}, "/metrics/serviceMonitor/enabled", "boolean"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", "IfNotPresent"),
    ({"replicas": 2}, "at ''", "replicas"),
    ({"agent": {"mode": "gpu"}}, "/agent/mode", "device-plugin"),
    ({"agent": {"nodeRestriction": "strict"}}, "/agent/nodeRestriction", "fields"),
    ({"agent": {"paths": {"cdiDir": "var/run/cdi"}}}, "/agent/paths/cdiDir", "does not match"),
    ({"extender": {"insecureServeWithoutAuth": "yes"}}, "/extender/insecureServeWithoutAuth", "boolean"),
    ({"extender": {"maxBodyBytes": 10}}, "/extender/maxBodyBytes", "minimum"),
    ({"extender": {"networkPolicy": {"from": {"ipBlock": {}}}}}, "/extender/networkPolicy/from", "array"),
    ({"tls": {"validityDays": 0}}, "/tls/validityDays", "minimum"),
    ({"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}, "/certManager/issuerRef/kind", "ClusterIssuer"),
    ({"certManager": {"duration": "1 year"}}, "/certManager/duration", "does not match"),
    ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy", "Ignore"),
    ({"webhook": {"objectSelector": {"matchLabel": {"a": "b"}}}}, "/webhook/objectSelector", "matchLabel"),
    ({"webhook": {"timeoutSeconds": 60}}, "/webhook/timeoutSeconds", "maximum"),
    ({"dra": {"extendedResource": {"name": "gpu"}}}, "/dra/extendedResource/name", "does not match"),
    ({"dra": {"driverName": "VGPU"}}, "/dra/driverName", "does not match"),
    ({"monitoring": {"prometheusRule": {"enabled": 1}}}, "/monitoring/prometheusRule/enabled", "boolean"),
]


@pytest.mark.parametrize(("values", "pointer", "word"), BAD_VALUES, ids=[b[1] for b in BAD_VALUES])
def test_bad_value_is_rejected_by_name(values: dict[str, Any], pointer: str, word: str) -> None:
    message = schema_error(values)
    assert pointer in message
    assert word in message


def test_render_refuses_values_the_schema_rejects() -> None:
    with pytest.raises(helm.HelmValuesError, match="/extender/policy"):
        render({"extender": {"policy": "random"}})


# Rules across several values, which the schema cannot express: the render fails and says why.
CROSS_FIELD: list[tuple[dict[str, Any], str]] = [
    ({"agent": {"health": {"tempHealthy": 95, "tempUnhealthy": 95}}}, "must be lower than"),
    ({"scheduler": {"replicas": 2, "leaderElect": False}}, "leaderElect"),
    ({"extender": {"service": {"nodePort": 31456}}}, "not NodePort"),
    ({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}, "metrics.service.enabled"),
    ({"dra": {"extendedResource": {"enabled": True}}}, "needs agent.mode dra or both"),
    ({"scheduler": {"extenderURL": "http://10.0.0.5:3456/gpumgr"}}, "use https://"),
]


@pytest.mark.parametrize(("values", "reason"), CROSS_FIELD, ids=[c[1] for c in CROSS_FIELD])
def test_inconsistent_values_fail_the_render(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=reason):
        render(values)
