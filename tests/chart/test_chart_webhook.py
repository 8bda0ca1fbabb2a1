"""The admission webhook: Deployment and Service for `gpumgr webhook`, and the MutatingWebhookConfiguration the API
server follows (which pods, which namespaces, which certificate authority)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from gpumgr.serving.tls import client_context
from gpumgr.webhook.server import TlsFiles, server_context

from .cel_support import evaluate
from .support import NAMESPACE, PREFIX, VARIANTS, Rendered, container, flags, positional, render, selects
from .tls_support import handshake, mounted_file

WEBHOOK = f"{PREFIX}-webhook"


def configuration(rendered: Rendered) -> dict[str, Any]:
    (hook,) = rendered.get("MutatingWebhookConfiguration", WEBHOOK)["webhooks"]
    assert isinstance(hook, dict)
    return hook


def test_webhook_command_follows_the_contract() -> None:
    deployment = render().get("Deployment", WEBHOOK)
    c = container(deployment, "webhook")
    assert c["command"] == ["gpumgr"]
    assert positional(c["args"]) == ["webhook"]
    assert flags(c["args"]) == {
        "listen": "0.0.0.0:8443",
        "tls-cert-file": "/etc/gpumgr-webhook/tls/tls.crt",
        "tls-key-file": "/etc/gpumgr-webhook/tls/tls.key",
        "scheduler-name": "gpumgr-scheduler",
        "max-cards-per-container": "16",
        "log-level": "info",
        "probe-listen": "0.0.0.0:8081",
    }
    # the kubelet has no client certificate: probes go to the plain-HTTP probe port, never to the API port
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"},
                          {"name": "probes", "containerPort": 8081, "protocol": "TCP"}]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True


def test_scheduler_name_follows_the_scheduler_mode() -> None:
    def name(values: dict[str, Any]) -> str | None:
        return flags(container(render(values).get("Deployment", WEBHOOK), "webhook")["args"])["scheduler-name"]

    assert name({"scheduler": {"name": "gpu-sched"}}) == "gpu-sched"
    assert name(VARIANTS["extender-only"]) == "default-scheduler"


def test_api_server_reaches_mutate_through_the_service() -> None:
    rendered = render()
    hook = configuration(rendered)
    ref = hook["clientConfig"]["service"]
    service = rendered.get("Service", ref["name"])
    assert ref == {"name": WEBHOOK, "namespace": NAMESPACE, "path": "/mutate", "port": 443}
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443 and port["targetPort"] == "https"
    deployment = rendered.get("Deployment", WEBHOOK)
    assert selects(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    others = [o for o in rendered.objects if o["kind"] in {"Deployment", "DaemonSet"} and o is not deployment]
    assert not any(selects(service["spec"]["selector"], o["spec"]["template"]["metadata"]["labels"]) for o in others)


def test_webhook_contract_fields() -> None:
    hook = configuration(render())
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Fail"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert "objectSelector" not in hook


def test_api_server_trusts_the_webhook_certificate(tmp_path: Path) -> None:
    rendered = render()
    deployment = rendered.get("Deployment", WEBHOOK)
    args = flags(container(deployment, "webhook")["args"])
    cert = mounted_file(rendered, deployment, "webhook", str(args["tls-cert-file"]), tmp_path)
    key = mounted_file(rendered, deployment, "webhook", str(args["tls-key-file"]), tmp_path)
    ca = tmp_path / "caBundle.pem"
    ca.write_bytes(base64.b64decode(configuration(rendered)["clientConfig"]["caBundle"]))
    # the API server calls https://<service>.<namespace>.svc and checks the name against the certificate
    handshake(server_context(TlsFiles(str(cert), str(key))), client_context(str(ca)), f"{WEBHOOK}.{NAMESPACE}.svc")


def test_a_ca_bundle_of_another_release_is_not_trusted(tmp_path: Path) -> None:
    ours, theirs = render(), render()
    deployment = ours.get("Deployment", WEBHOOK)
    cert = mounted_file(ours, deployment, "webhook", "/etc/gpumgr-webhook/tls/tls.crt", tmp_path)
    key = mounted_file(ours, deployment, "webhook", "/etc/gpumgr-webhook/tls/tls.key", tmp_path)
    ca = tmp_path / "theirs.pem"
    ca.write_bytes(base64.b64decode(configuration(theirs)["clientConfig"]["caBundle"]))
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        handshake(server_context(TlsFiles(str(cert), str(key))), client_context(str(ca)), f"{WEBHOOK}.{NAMESPACE}.svc")


def test_cert_manager_injects_the_ca_bundle() -> None:
    rendered = render(VARIANTS["cert-manager"])
    config = rendered.get("MutatingWebhookConfiguration", WEBHOOK)
    assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{WEBHOOK}-tls"}
    assert "caBundle" not in configuration(rendered)["clientConfig"]
    certificate = next(c for c in rendered.all("Certificate") if c["metadata"]["name"] == f"{WEBHOOK}-tls")
    assert f"{WEBHOOK}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]


def excluded_namespaces(hook: dict[str, Any]) -> list[str]:
    (expression, *_) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
    values: list[str] = expression["values"]
    return values


def test_control_plane_and_own_namespace_are_never_sent() -> None:
    assert excluded_namespaces(configuration(render())) == ["kube-system", NAMESPACE]
    values = {
        "webhook": {
            "excludeNamespaces": ["batch", "kube-system"],
            "namespaceSelector": {"matchLabels": {"gpu": "yes"}},
            "objectSelector": {"matchLabels": {"team": "ml"}},
            "failurePolicy": "Ignore",
        }
    }
    hook = configuration(render(values))
    assert excluded_namespaces(hook) == ["kube-system", NAMESPACE, "batch"]
    assert hook["namespaceSelector"]["matchLabels"] == {"gpu": "yes"}
    assert hook["objectSelector"] == {"matchLabels": {"team": "ml"}}
    assert hook["failurePolicy"] == "Ignore"


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


PLAIN = {"name": "app", "image": "busybox"}
CPU = {"name": "app", "image": "busybox", "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}}}
SHARE = {"name": "cuda", "image": "cuda", "resources": {"limits": {"tencent.com/vcuda-core": "30"}}}
MEMORY_ONLY = {"name": "cuda", "image": "cuda", "resources": {"requests": {"tencent.com/vcuda-memory": "8"}}}
OTHER_GPU = {"name": "cuda", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}


@pytest.mark.parametrize(
    ("obj", "sent"),
    [
        (pod(PLAIN), False),
        (pod(CPU), False),
        (pod(OTHER_GPU), False),
        (pod(SHARE), True),
        (pod(MEMORY_ONLY), True),
        (pod(CPU, SHARE), True),
        (pod(PLAIN, init=(SHARE,)), True),
        (pod(PLAIN, init=(CPU,)), False),
    ],
    ids=["plain", "cpu", "nvidia-gpu", "vcuda-core", "vcuda-memory-request", "second-container", "init", "init-cpu"],
)
def test_only_pods_asking_for_a_vgpu_are_sent(obj: dict[str, Any], sent: bool) -> None:
    (condition,) = configuration(render())["matchConditions"]
    assert evaluate(condition["expression"], {"object": obj, "oldObject": None}) is sent


def test_webhook_can_be_turned_off() -> None:
    rendered = render(VARIANTS["no-webhook"])
    assert rendered.all("MutatingWebhookConfiguration") == []
    assert all("webhook" not in o["metadata"]["name"] for o in rendered.objects)


def test_max_cards_per_container_is_passed_and_bounded() -> None:
    c = container(render({"webhook": {"maxCardsPerContainer": 8}}).get("Deployment", WEBHOOK), "webhook")
    assert flags(c["args"])["max-cards-per-container"] == "8"
    for bad in (0, 5000, "16"):
        with pytest.raises(Exception, match="maxCardsPerContainer"):
            render({"webhook": {"maxCardsPerContainer": bad}})


def test_probe_port_is_configurable_and_not_behind_the_service() -> None:
    rendered = render({"webhook": {"probePort": 9090}})
    c = container(rendered.get("Deployment", WEBHOOK), "webhook")
    assert flags(c["args"])["probe-listen"] == "0.0.0.0:9090"
    assert {"name": "probes", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    (port,) = rendered.get("Service", WEBHOOK)["spec"]["ports"]
    assert port["targetPort"] == "https"


def client_ca_mount(rendered: Rendered) -> tuple[str, dict[str, Any]]:
    """The --client-ca-file path and the volume that holds it."""
    deployment = rendered.get("Deployment", WEBHOOK)
    c = container(deployment, "webhook")
    path = str(flags(c["args"])["client-ca-file"])
    (mount,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert path == f"{mount['mountPath']}/ca.crt"
    return path, volume


def test_no_client_ca_by_default() -> None:
    rendered = render()
    c = container(rendered.get("Deployment", WEBHOOK), "webhook")
    assert "client-ca-file" not in flags(c["args"])
    assert [v["name"] for v in rendered.get("Deployment", WEBHOOK)["spec"]["template"]["spec"]["volumes"]] == ["tls"]
    assert not [o for o in rendered.all("ConfigMap") if "client-ca" in o["metadata"]["name"]]


def test_client_ca_from_a_configmap_is_mounted_and_required() -> None:
    rendered = render({"webhook": {"clientCA": {"configMap": "apiserver-webhook-ca"}}})
    _, volume = client_ca_mount(rendered)
    assert volume["configMap"] == {"name": "apiserver-webhook-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert not [o for o in rendered.all("ConfigMap") if "client-ca" in o["metadata"]["name"]]  # the user's own


def test_client_ca_given_inline_is_put_in_a_configmap_and_required(tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    rendered = render({"webhook": {"clientCA": {"pem": pem}}})
    _, volume = client_ca_mount(rendered)
    config_map = rendered.get("ConfigMap", volume["configMap"]["name"])
    assert config_map["metadata"]["namespace"] == NAMESPACE and config_map["data"] == {"ca.crt": pem}


def test_client_ca_refuses_both_sources_and_bad_values() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    with pytest.raises(Exception, match="configMap or pem, not both"):
        render({"webhook": {"clientCA": {"configMap": "ca", "pem": pem}}})
    for bad in ({"configMap": "Not A Name"}, {"pem": "not a certificate"}, {"secret": "ca"}):
        with pytest.raises(Exception, match="clientCA"):
            render({"webhook": {"clientCA": bad}})
