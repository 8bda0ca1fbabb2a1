"""The webhook needs matchConditions (GA in Kubernetes 1.28): on older clusters the chart refuses to render it,
rather than install a webhook the API server rejects (1.25, 1.26) or one that sees every pod creation with
failurePolicy Fail (1.27, where the field is alpha and dropped)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from .support import CHART_DIR, NAMESPACE, render

MESSAGE = "webhook.enabled needs Kubernetes >= 1.28"


def lint_output(capfd: pytest.CaptureFixture[str], version: str, values: dict[str, Any]) -> str:
    """What a render at `version` reports: `helm lint` renders with that cluster version and logs (on stderr)
    the message of a template's `fail` instead of stopping."""
    capfd.readouterr()
    helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=version)
    return capfd.readouterr().err


@pytest.mark.parametrize(("version", "refused"), [("v1.25.0", True), ("v1.26.5", True), ("v1.27.16", True),
                                                  ("v1.28.0", False), ("v1.30.2", False)])
def test_default_install_is_refused_below_1_28(capfd: pytest.CaptureFixture[str], version: str,
                                               refused: bool) -> None:
    out = lint_output(capfd, version, {})
    assert (MESSAGE in out) is refused, out
    if refused:
        assert f"the cluster is {version}" in out and "set webhook.enabled=false" in out


def test_without_the_webhook_1_25_installs(capfd: pytest.CaptureFixture[str]) -> None:
    out = lint_output(capfd, "v1.25.0", {"webhook": {"enabled": False}})
    assert "funcMap fail" not in out, out


@pytest.fixture
def helper_chart(tmp_path: Path) -> Path:
    """A chart holding the real helpers and one template that calls the check with a chosen cluster version."""
    chart = tmp_path / "check"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: check\nversion: 0.1.0\n")
    shutil.copy(CHART_DIR / "templates" / "_helpers.tpl", chart / "templates" / "_helpers.tpl")
    (chart / "templates" / "check.yaml").write_text(
        '{{- $caps := dict "KubeVersion" (dict "Version" .Values.kube) }}\n'
        '{{- include "gpumgr.webhookKubeVersion" (dict "Values" .Values "Capabilities" $caps "Chart" .Chart) }}\n'
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n")
    return chart


def _render(chart: Path, kube: str, enabled: bool) -> dict[str, str]:
    values = {"kube": kube, "webhook": {"enabled": enabled}, "scheduler": {"mode": "profile", "name": "gpu-sched"}}
    with helm.Chart.load(chart) as c:
        return dict(c.render(values, name="r", namespace="n", is_install=True))


def test_the_check_stops_a_real_render(helper_chart: Path) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"needs Kubernetes >= 1\.28.*v1\.27\.3.*schedulerName: gpu-sched"):
        _render(helper_chart, "v1.27.3", True)
    assert _render(helper_chart, "v1.28.1", True)
    assert _render(helper_chart, "v1.25.0", False)


def test_the_default_render_has_the_webhook() -> None:
    assert render().all("MutatingWebhookConfiguration")
