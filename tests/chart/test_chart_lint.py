"""`helm lint` (through the Helm SDK) finds no warning or error, for the defaults and every variant."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from .support import CHART_DIR, KUBE_VERSIONS, NAMESPACE, VARIANTS

WARNING = 2


def problems(report: dict[str, Any]) -> list[str]:
    return [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= WARNING]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_is_clean(variant: str, kube_version: str) -> None:
    report = helm.lint(CHART_DIR, VARIANTS[variant], strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    assert problems(report) == []


def test_lint_reports_a_bad_value() -> None:
    report = helm.lint(CHART_DIR, {"extender": {"policy": "random"}}, strict=True, namespace=NAMESPACE)
    assert report["errors"], "lint accepted extender.policy=random"
    assert any("/extender/policy" in p and "binpack" in p for p in problems(report))


def test_chart_metadata() -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        meta = chart.metadata
        assert chart.schema is not None
        assert chart.schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert (meta["apiVersion"], meta["name"], meta["version"], meta["appVersion"]) == (
        "v2",
        "gpu-manager",
        "0.1.0",
        "0.1.0",
    )
