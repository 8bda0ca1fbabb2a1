"""docs/installation.md documents every value of the chart, and only values that exist."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import yaml

from .support import CHART_DIR

DOC = CHART_DIR.parents[1] / "docs" / "installation.md"


# Values documented as one row although their default is a map.
OPAQUE = ("resources", "securityContext", "nodeSelector", "dashboard.labels")


def leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not path.endswith(OPAQUE):
            yield from leaves(value, f"{path}.")
        else:
            yield path


def documented_values() -> set[str]:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    return {m.group(1) for row in rows if (m := re.match(r"\| `([A-Za-z0-9.]+)`", row))}


def test_every_value_is_documented() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    missing = sorted(set(leaves(values)) - documented_values())
    assert missing == []


def test_every_documented_value_exists() -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        defaults = chart.values
    for path in documented_values():
        if "." not in path and path not in defaults:
            continue  # a table row that is not a value
        node: Any = defaults
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"{path} is documented but not a value"
            node = node[part]


def test_webhook_doc_shows_what_the_chart_renders() -> None:
    # docs/webhook.md once described another configuration (failurePolicy Ignore, another name, Service, port and
    # namespace, no matchConditions); compare its YAML block with the rendered object, field by field.
    from .support import render

    text = (CHART_DIR.parents[1] / "docs" / "webhook.md").read_text()
    block = text.split("## Configuration in the cluster", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    documented = yaml.safe_load(block)
    rendered = render().get("MutatingWebhookConfiguration", documented["metadata"]["name"])
    doc_hook, hook = documented["webhooks"][0], rendered["webhooks"][0]
    for key in ("name", "admissionReviewVersions", "sideEffects", "failurePolicy", "timeoutSeconds",
                "reinvocationPolicy", "rules", "namespaceSelector"):
        assert doc_hook[key] == hook[key], key
    assert doc_hook["clientConfig"]["service"] == hook["clientConfig"]["service"]
    assert [c["name"] for c in doc_hook["matchConditions"]] == [c["name"] for c in hook["matchConditions"]]
