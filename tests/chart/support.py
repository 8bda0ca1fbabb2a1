"""Render the gpu-manager chart with the Helm SDK and look objects up in the result."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "gpu-manager"
RELEASE = "gpumgr"
NAMESPACE = "gpu-system"
PREFIX = f"{RELEASE}-gpu-manager"

# Kubernetes versions every rendered object is validated against (kubernetes-validate ships both).
KUBE_VERSIONS = ("1.30.0", "1.34.0")

# Value sets the tests render besides the defaults; each one exercises a different branch.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "extender-only": {
        "scheduler": {"mode": "extender-only", "extenderURL": "https://10.96.0.50:3456/gpumgr"},
        "extender": {"networkPolicy": {"from": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]}},
    },
    "insecure": {"extender": {"insecureServeWithoutAuth": True}},
    "cert-manager": {"certManager": {"enabled": True}},
    "cert-manager-issuer": {
        "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
    },
    "no-webhook": {"webhook": {"enabled": False}},
    "dra": {"agent": {"mode": "dra"}, "dra": {"extendedResource": {"enabled": True}}},
    "both": {"agent": {"mode": "both"}},
    "prometheus-rule": {"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}}}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}}}},
    "custom-placement": {
        "agent": {
            "nodeSelector": {"nvidia.com/gpu.present": None, "node-role/gpu": "a100"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}],
            "resources": {"requests": {"cpu": "250m", "memory": "200Mi"}, "limits": {"memory": "1Gi"}},
            "priorityClassName": "",
        },
        "extender": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
    },
    "cdi": {"agent": {"cdi": True}},
    "spread": {"extender": {"policy": "spread"}},
    "extender-ha": {"extender": {"replicas": 3}},
    "extender-single": {"extender": {"replicas": 1}},
    "operator-extras": {
        "image": {"tag": "0.2.0-rc1", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "commonLabels": {"team": "ml-platform"},
        "agent": {
            "kubeconfig": "/etc/gpumgr/kubeconfig",
            "runtimeClassName": "nvidia",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "extraVolumes": [{"name": "kubeconfig", "secret": {"secretName": "gpumgr-kubeconfig"}}],
            "extraVolumeMounts": [{"name": "kubeconfig", "mountPath": "/etc/gpumgr", "readOnly": True}],
            "updateStrategy": {"maxUnavailable": "20%"},
        },
        "extender": {"service": {"type": "NodePort", "nodePort": 31456}},
        "scheduler": {"image": {"tag": "v1.31.4"}, "replicas": 2},
    },
}


# The oldest Kubernetes version a variant installs on (the chart refuses older clusters for it).
MIN_KUBE: dict[str, str] = {"dra": "1.34.0", "both": "1.34.0"}


def supported(variant: str, version: str) -> bool:
    minimum = MIN_KUBE.get(variant, "0")
    return tuple(int(p) for p in version.split(".")) >= tuple(int(p) for p in minimum.split("."))


@dataclass(frozen=True)
class Rendered:
    """The Kubernetes objects and the NOTES of one render."""

    objects: list[dict[str, Any]]
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}: {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects)


def render(values: dict[str, Any] | None = None) -> Rendered:
    """Render the chart offline as `helm template` would, for release RELEASE in NAMESPACE."""
    with helm.Chart.load(CHART_DIR) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(objects=objects, notes=notes)


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"no single container {name} in {workload['metadata']['name']}"
    return found[0]


def flags(args: list[str]) -> dict[str, str | None]:
    """`--name=value` arguments as {name: value}; a bare `--name` maps to None. Rejects duplicates."""
    parsed: dict[str, str | None] = {}
    for arg in args:
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        assert name not in parsed, f"flag --{name} given twice in {shlex.join(args)}"
        parsed[name] = value if sep else None
    return parsed


def positional(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("--")]


def host_mounts(workload: dict[str, Any], container_name: str) -> Iterator[tuple[str, str, bool]]:
    """(host path, path in the container, read-only) for every hostPath volume the container mounts."""
    pod = workload["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    for mount in container(workload, container_name).get("volumeMounts", []):
        if mount["name"] in host_paths:
            yield host_paths[mount["name"]], mount["mountPath"], bool(mount.get("readOnly", False))


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
