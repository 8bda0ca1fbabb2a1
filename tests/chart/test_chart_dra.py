"""DRA in the chart: the agent's mode flags, its host directories and API rights, and the two DeviceClasses, valid
for Kubernetes 1.34 and for the newest version kubernetes-validate knows."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from .cel_support import evaluate
from .support import PREFIX, VARIANTS, container, flags, host_mounts, render

AGENT = f"{PREFIX}-agent"
DRA_VERSIONS = ("1.34.0", kubernetes_validate.latest_version())
DRIVER = "vgpu.gpumgr.io"


def agent(values: dict[str, Any]) -> dict[str, Any]:
    return render(values).get("DaemonSet", AGENT)


def test_device_plugin_mode_has_no_dra() -> None:
    rendered = render()
    assert rendered.all("DeviceClass") == []
    args = flags(container(rendered.get("DaemonSet", AGENT), "agent")["args"])
    assert args["mode"] == "device-plugin"
    assert not {"dra-driver-name", "cdi-dir", "dra-plugin-dir", "plugins-registry-dir"} & set(args)
    hosts = {host for host, _, _ in host_mounts(rendered.get("DaemonSet", AGENT), "agent")}
    assert not {"/var/run/cdi", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"} & hosts
    resources = {r for rule in rendered.get("ClusterRole", AGENT)["rules"] for r in rule["resources"]}
    assert not {"resourceslices", "resourceclaims"} & resources


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_dra_mode_flags_and_host_directories(mode: str) -> None:
    ds = agent({"agent": {"mode": mode}})
    args = flags(container(ds, "agent")["args"])
    assert args["mode"] == mode
    assert args["dra-driver-name"] == DRIVER
    assert args["cdi-dir"] == "/var/run/cdi"
    assert args["dra-plugin-dir"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert args["plugins-registry-dir"] == "/var/lib/kubelet/plugins_registry"
    mounts = {host: (inside, ro) for host, inside, ro in host_mounts(ds, "agent")}
    # each directory at the same path inside, writable: the agent writes CDI specs and serves its sockets there
    for host in ("/var/run/cdi", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"):
        assert mounts[host] == (host, False)
    plugin_dir = args["dra-plugin-dir"]
    assert plugin_dir is not None and plugin_dir.startswith("/var/lib/kubelet/plugins/")


def test_dra_paths_follow_the_values() -> None:
    values = {
        "agent": {
            "mode": "dra",
            "paths": {
                "cdiDir": "/etc/cdi-dyn",
                "kubeletPluginsDir": "/data/kubelet/plugins",
                "pluginsRegistryDir": "/data/kubelet/plugins_registry",
            },
        },
        "dra": {"driverName": "vgpu.example.com"},
    }
    ds = agent(values)
    args = flags(container(ds, "agent")["args"])
    mounts = {host: inside for host, inside, _ in host_mounts(ds, "agent")}
    assert args["cdi-dir"] == mounts["/etc/cdi-dyn"] == "/etc/cdi-dyn"
    assert args["dra-plugin-dir"] == "/data/kubelet/plugins/vgpu.example.com"
    assert mounts["/data/kubelet/plugins"] == "/data/kubelet/plugins"
    assert args["plugins-registry-dir"] == mounts["/data/kubelet/plugins_registry"]
    assert args["dra-driver-name"] == "vgpu.example.com"


def test_dra_rights_of_the_agent() -> None:
    role = render({"agent": {"mode": "both"}}).get("ClusterRole", AGENT)
    dra = {
        (resource, verb)
        for rule in role["rules"]
        if rule["apiGroups"] == ["resource.k8s.io"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    expected = {("resourceslices", v) for v in ("get", "list", "watch", "create", "update", "patch", "delete")}
    expected |= {("resourceclaims", v) for v in ("get", "list", "watch")}
    # no resourceclaims/status: the agent never writes a claim's status (the real cluster runs it without)
    expected |= {("deviceclasses", v) for v in ("get", "list", "watch")}
    assert dra == expected


WHOLE_CARDS = ('device.driver == "vgpu.gpumgr.io" && (!("type" in device.attributes["vgpu.gpumgr.io"]) || '
               'device.attributes["vgpu.gpumgr.io"].type == "gpu")')


def device_classes(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in render(values).all("DeviceClass")}


def test_device_classes() -> None:
    classes = device_classes({"agent": {"mode": "dra"}})
    assert set(classes) == {"vgpu.gpumgr.io", "gpu.gpumgr.io"}
    for dc in classes.values():
        assert dc["apiVersion"] == "resource.k8s.io/v1"
        assert "namespace" not in dc["metadata"]
        assert dc["spec"]["selectors"] == [{"cel": {"expression": WHOLE_CARDS}}]
        assert "extendedResourceName" not in dc["spec"]
    whole = device_classes(VARIANTS["dra"])["gpu.gpumgr.io"]
    assert whole["spec"]["extendedResourceName"] == "gpumgr.io/gpu"
    assert "extendedResourceName" not in device_classes(VARIANTS["dra"])["vgpu.gpumgr.io"]["spec"]


@pytest.mark.parametrize(("driver", "kind", "selected"), [
    (DRIVER, None, True), (DRIVER, "gpu", True), (DRIVER, "mig", False), ("gpu.nvidia.com", None, False)])
def test_selector_picks_the_drivers_whole_cards(driver: str, kind: str | None, selected: bool) -> None:
    """The fractional and whole-card classes never select a MIG device of the same driver (a whole-card claim
    was given a MIG instance on a MIG node); a device without the type attribute (an older agent) is a card."""
    attributes: dict[str, Any] = {"model": "A100", "index": 0}
    if kind is not None:
        attributes["type"] = kind
    device = {
        "driver": driver,
        "attributes": {DRIVER: attributes},
        "capacity": {DRIVER: {"memory": 42949672960, "cores": 100}},
        "allowMultipleAllocations": True,
    }
    for dc in device_classes({"agent": {"mode": "both"}}).values():
        for selector in dc["spec"]["selectors"]:
            assert evaluate(selector["cel"]["expression"], {"device": device}) is selected


@pytest.mark.parametrize("version", DRA_VERSIONS)
def test_device_classes_validate(version: str) -> None:
    for dc in device_classes(VARIANTS["dra"]).values():
        kubernetes_validate.validate(dc, version, strict=True)


def test_validation_of_a_device_class_can_fail() -> None:
    dc = device_classes(VARIANTS["dra"])["gpu.gpumgr.io"]
    dc["spec"]["selectors"] = [{"expression": "true"}]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dc, DRA_VERSIONS[0], strict=True)


def test_extended_resource_needs_dra() -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError, match="needs agent.mode dra or both"):
        render({"dra": {"extendedResource": {"enabled": True}}})
