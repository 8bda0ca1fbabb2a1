"""The agent's MIG values (agent.mig): layout, named layouts, resource prefix and strategy become `gpumgr run`'s
flags; the layouts are a ConfigMap the agent reads (and that gpumgr's own layout reader accepts); the extender can
manage the per-profile resources; an opt-in DeviceClass selects the MIG devices of the DRA pool. The defaults pass
no MIG flag and render no MIG object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from gpumgr.mig.agent import load_layouts, parse_shared
from gpumgr.mig.layout import parse

from .cel_support import evaluate
from .support import CHART_DIR, PREFIX, container, flags, render

AGENT = f"{PREFIX}-agent"
LAYOUTS = {"halves": {"all": ["3g.40gb", "3g.40gb"]}, "mixed-0": {"0": ["4g.40gb", "2g.20gb", "1g.10gb"]}}


def agent_flags(values: dict[str, Any]) -> dict[str, str | None]:
    return flags(container(render(values).get("DaemonSet", AGENT), "agent")["args"])


def test_defaults_pass_no_mig_flag() -> None:
    assert not [f for f in agent_flags({}) if f.startswith("mig-")]
    assert all(c["metadata"]["name"] != f"{AGENT}-mig-layouts" for c in render({}).all("ConfigMap"))


def test_a_layout_becomes_the_agents_flags() -> None:
    got = {k: v for k, v in agent_flags({"agent": {"mig": {"layout": "all-1g.10gb"}}}).items() if k.startswith("mig-")}
    assert got == {"mig-layout": "all-1g.10gb", "mig-resource-prefix": "nvidia.com/mig-", "mig-strategy": "mixed",
                   "mig-minors": "/host/proc/driver/nvidia-caps/mig-minors"}


def test_a_prefix_alone_is_passed() -> None:
    got = agent_flags({"agent": {"mig": {"resourcePrefix": "example.com/mig-"}}})
    assert got["mig-resource-prefix"] == "example.com/mig-" and "mig-layout" not in got


def test_the_longest_prefix_the_agent_takes_is_valid() -> None:
    # the schema once allowed 21 characters after the slash and the agent's --mig-resource-prefix 30
    prefix = "example.com/" + "m" * 30
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema({"agent": {"mig": {"resourcePrefix": prefix}}})
    assert agent_flags({"agent": {"mig": {"resourcePrefix": prefix}}})["mig-resource-prefix"] == prefix


def test_named_layouts_are_a_configmap_the_agent_reads(tmp_path: Path) -> None:
    out = render({"agent": {"mig": {"layout": "halves", "layouts": LAYOUTS}}})
    ds = out.get("DaemonSet", AGENT)
    c = container(ds, "agent")
    f = flags(c["args"])
    assert f["mig-layout"] == "halves" and f["mig-layouts-file"] == "/etc/gpumgr/mig/layouts.json"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "mig-layouts")
    assert mount["mountPath"] == "/etc/gpumgr/mig" and mount["readOnly"] is True
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "mig-layouts")
    cm = out.get("ConfigMap", volume["configMap"]["name"])
    # the rendered file is what the agent's own reader takes
    (tmp_path / "layouts.json").write_text(cm["data"]["layouts.json"])
    layouts = load_layouts(str(tmp_path / "layouts.json"))
    assert json.loads(cm["data"]["layouts.json"]) == LAYOUTS
    parse("halves", layouts)
    parse("mixed-0", layouts)
    # a change of the layouts rolls the agents (they read them at start)
    other = render({"agent": {"mig": {"layout": "halves", "layouts": {"halves": {"all": ["7g.80gb"]}}}}})
    key = "gpumgr.io/mig-layouts-checksum"
    assert (ds["spec"]["template"]["metadata"]["annotations"][key]
            != other.get("DaemonSet", AGENT)["spec"]["template"]["metadata"]["annotations"][key])


def test_shared_profiles_become_the_agents_flag_and_its_parser_takes_it() -> None:
    got = agent_flags({"agent": {"mig": {"shared": {"1g.10gb": 4, "2g.20gb": 2}}}})
    assert got["mig-shared"] == "1g.10gb=4,2g.20gb=2" and got["mig-resource-prefix"] == "nvidia.com/mig-"
    assert parse_shared(got["mig-shared"] or "") == {"1g.10gb": 4, "2g.20gb": 2}
    assert "mig-shared" not in agent_flags({"agent": {"mig": {"layout": "all-1g.10gb"}}})


def test_extender_profiles_are_managed_resources() -> None:
    cm = render({"agent": {"mig": {"extenderProfiles": ["1g.10gb", "3g.40gb"]}}}).all("ConfigMap")
    text = "\n".join(json.dumps(c.get("data", {})) for c in cm)
    for profile in ("1g.10gb", "3g.40gb"):
        assert f"name: \\\"nvidia.com/mig-{profile}\\\"" in text, text[:2000]


@pytest.mark.parametrize(("values", "word"), [
    ({"strategy": "single"}, "mixed"),
    ({"layout": "All 1g"}, "layout"),
    ({"layouts": {"halves": {"first": ["3g.40gb"]}}}, "first"),
    ({"layouts": {"halves": {"all": ["3g"]}}}, "3g"),
    ({"resourcePrefix": "NVIDIA.com/mig-"}, "resourcePrefix"),
    ({"resourcePrefix": "example.com/" + "m" * 31}, "resourcePrefix"),  # the agent refuses more than 30 as well
    ({"extenderProfiles": ["one"]}, "one"),
    ({"shared": {"1g.10gb": 1}}, "minimum"),
    ({"shared": {"1g.10gb": 65}}, "maximum"),
    ({"shared": {"tenth": 4}}, "tenth"),
])
def test_bad_mig_values_are_refused_by_name(values: dict[str, Any], word: str) -> None:
    with helm.Chart.load(CHART_DIR) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema({"agent": {"mig": values}})
    text = str(caught.value)  # a bad key is named as such (helm's schema errors give no pointer for keys)
    assert ("/agent/mig" in text or "invalid propertyName" in text) and word in text, text


def mig_class(values: dict[str, Any]) -> dict[str, Any] | None:
    return next((d for d in render(values).all("DeviceClass") if d["metadata"]["name"] == "mig.gpumgr.io"), None)


def test_the_mig_device_class_is_opt_in_and_selects_mig_devices_only() -> None:
    assert mig_class({"agent": {"mode": "both"}}) is None
    assert mig_class({"agent": {"mode": "device-plugin"}, "dra": {"deviceClasses": {"mig": "mig.gpumgr.io"}}}) is None
    dc = mig_class({"agent": {"mode": "both"}, "dra": {"deviceClasses": {"mig": "mig.gpumgr.io"}}})
    assert dc is not None and dc["apiVersion"] == "resource.k8s.io/v1"
    [selector] = dc["spec"]["selectors"]

    def device(driver: str, kind: str) -> dict[str, Any]:
        return {"driver": driver, "attributes": {driver: {"type": kind, "profile": "3g.40gb", "index": 0}},
                "capacity": {driver: {"memory": 42949672960}}, "allowMultipleAllocations": False}

    expression = selector["cel"]["expression"]
    assert evaluate(expression, {"device": device("vgpu.gpumgr.io", "mig")}) is True
    assert evaluate(expression, {"device": device("vgpu.gpumgr.io", "gpu")}) is False
    assert evaluate(expression, {"device": device("gpu.nvidia.com", "mig")}) is False


@pytest.mark.parametrize("version", ("1.34.0", kubernetes_validate.latest_version()))
def test_the_mig_device_class_validates(version: str) -> None:
    dc = mig_class({"agent": {"mode": "both"}, "dra": {"deviceClasses": {"mig": "mig.gpumgr.io"}}})
    kubernetes_validate.validate(dc, version, strict=True)


def test_the_node_restriction_lets_the_agent_write_the_mig_labels_but_not_the_operators_layout() -> None:
    """The agent writes GPU Feature Discovery's MIG labels (gpumgr/mig/labels.py); the API server's policy must
    let it (the real cluster refused them before), and still refuse the operator's nvidia.com/mig.config."""
    from gpumgr.mig.labels import mig_labels

    from .test_chart_node_restriction import a_node, changed, policy, update

    pol = policy()
    node = a_node("gpu-node-1")  # the node the agent's token is bound to
    mine = mig_labels([], _ledger(), refused=False)
    patched = node
    for k, v in {**mine, "nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig-1g.10gb.replicas": "4"}.items():
        patched = changed(patched, ("metadata", "labels", k), v)
    assert update(pol, "nodes", node, patched).allowed
    denied = update(pol, "nodes", node, changed(node, ("metadata", "labels", "nvidia.com/mig.config"), "all-1g.10gb"))
    assert denied.denied and "(never nvidia.com/mig.config)" in denied.denied[0]
    assert not update(pol, "nodes", node, changed(node, ("metadata", "labels", "nvidia.com/gpu.product"), "x")).allowed
    # the operator's layout, once set, is neither changed nor removed by the agent (docs/mig.md: never touched)
    laid = changed(node, ("metadata", "labels", "nvidia.com/mig.config"), "all-1g.10gb")
    assert not update(pol, "nodes", laid, changed(laid, ("metadata", "labels", "nvidia.com/mig.config"),
                                                  "all-disabled")).allowed
    assert not update(pol, "nodes", laid, changed(laid, ("metadata", "labels", "nvidia.com/mig.config"), None)).allowed
    assert update(pol, "nodes", laid, changed(laid, ("metadata", "labels", "nvidia.com/mig.config.state"),
                                              "success")).allowed


def _ledger() -> Any:
    from gpumgr.allocator import Ledger

    return Ledger([81920])
