"""Every rendered object is a valid Kubernetes object (strict schemas of two Kubernetes versions)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from .support import KUBE_VERSIONS, NAMESPACE, VARIANTS, render, supported

# Custom resources kubernetes-validate has no schema for; they are checked by shape in their own tests.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
}


def validate(obj: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version} at {where}: {error.message}")


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_validates(variant: str, version: str) -> None:
    if not supported(variant, version):
        pytest.skip(f"{variant} needs a newer Kubernetes than {version} (the chart refuses it there)")
    rendered = render(VARIANTS[variant])
    assert rendered.objects
    for obj in rendered.objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        validate(obj, version)


def test_validation_can_fail() -> None:
    daemonset = render().all("DaemonSet")[0]
    daemonset["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSIONS[0], strict=True)
    daemonset["spec"]["template"]["spec"]["hostPID"] = True
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSIONS[0], strict=True)


def test_only_known_custom_kinds_are_skipped() -> None:
    kinds = {(o["apiVersion"], o["kind"]) for v in VARIANTS.values() for o in render(v).objects}
    for api_version, kind in kinds - CUSTOM_KINDS:
        obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
        try:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"no Kubernetes schema for {api_version} {kind}")
        except kubernetes_validate.ValidationError:
            pass  # the stub is incomplete; what matters is that a schema exists


def test_namespaced_objects_live_in_the_release_namespace() -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
    }
    variants = ("service-monitor", "cert-manager", "dra", "prometheus-rule")
    objects = [o for v in variants for o in render(VARIANTS[v]).objects]
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, obj["metadata"]["name"]
        elif obj["kind"] == "RoleBinding" and obj["roleRef"]["name"] == "extension-apiserver-authentication-reader":
            assert namespace == "kube-system"
        else:
            assert namespace == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


def test_object_names_are_unique_and_fit_dns_labels() -> None:
    values = {"fullnameOverride": "a-very-long-release-prefix-for-gpu-manager-objects-in-this-cluster"}
    rendered = render(values)
    names = rendered.names()
    assert len(names) == len(set(names))
    for obj in rendered.objects:
        if obj["kind"] in {"Service", "DaemonSet", "Deployment"}:
            assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
