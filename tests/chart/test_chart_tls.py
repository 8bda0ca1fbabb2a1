"""The extender is authenticated by default: HTTPS with client certificates made by the chart, the scheduler
configured to present one, and a NetworkPolicy that admits only the scheduler.

The handshakes use the extender's own TLS code (gpumgr.serving.tls) on the very files the rendered pods mount."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from gpumgr.serving.tls import client_context, server_context

from .support import NAMESPACE, PREFIX, VARIANTS, Rendered, container, flags, render, selects
from .tls_support import handshake, mounted_file

EXTENDER = f"{PREFIX}-extender"
SCHEDULER = f"{PREFIX}-scheduler"
SERVICE_HOST = f"{EXTENDER}.{NAMESPACE}.svc"


def extender_server(rendered: Rendered, tmp: Path) -> ssl.SSLContext:
    """The server context `gpumgr extender` builds from the flags and files of the rendered Deployment."""
    deployment = rendered.get("Deployment", EXTENDER)
    args = flags(container(deployment, "extender")["args"])
    files = {}
    for flag in ("tls-cert-file", "tls-key-file", "client-ca-file"):
        path = args[flag]
        assert path is not None, flag
        files[flag] = str(mounted_file(rendered, deployment, "extender", path, tmp / "extender"))
    return server_context(files["tls-cert-file"], files["tls-key-file"], files["client-ca-file"])


def scheduler_stanza(rendered: Rendered) -> dict[str, Any]:
    config = yaml.safe_load(rendered.get("ConfigMap", SCHEDULER)["data"]["config.yaml"])
    (stanza,) = config["extenders"]
    assert isinstance(stanza, dict)
    return stanza


def scheduler_client(rendered: Rendered, tmp: Path, with_certificate: bool = True) -> ssl.SSLContext:
    """What kube-scheduler presents, from the stanza's tlsConfig and the files its Deployment mounts."""
    tls = scheduler_stanza(rendered)["tlsConfig"]
    deployment = rendered.get("Deployment", SCHEDULER)

    def file(key: str) -> str:
        return str(mounted_file(rendered, deployment, "kube-scheduler", tls[key], tmp / "scheduler"))

    if not with_certificate:
        return client_context(file("caFile"))
    return client_context(file("caFile"), file("certFile"), file("keyFile"))


def test_authentication_is_on_by_default() -> None:
    rendered = render()
    stanza = scheduler_stanza(rendered)
    assert stanza["enableHTTPS"] is True
    assert stanza["urlPrefix"].startswith("https://")
    args = flags(container(rendered.get("Deployment", EXTENDER), "extender")["args"])
    assert "insecure-serve-without-auth" not in args
    assert args["client-ca-file"]


def test_scheduler_and_extender_complete_a_mutual_tls_handshake(tmp_path: Path) -> None:
    rendered = render()
    server_name = scheduler_stanza(rendered)["tlsConfig"]["serverName"]
    assert server_name == SERVICE_HOST
    handshake(extender_server(rendered, tmp_path), scheduler_client(rendered, tmp_path), server_name)


@pytest.mark.parametrize("name", [EXTENDER, f"{EXTENDER}.{NAMESPACE}", SERVICE_HOST, f"{SERVICE_HOST}.cluster.local"])
def test_serving_certificate_names_the_service(tmp_path: Path, name: str) -> None:
    rendered = render()
    handshake(extender_server(rendered, tmp_path), scheduler_client(rendered, tmp_path), name)


def test_serving_certificate_names_nothing_else(tmp_path: Path) -> None:
    rendered = render()
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(extender_server(rendered, tmp_path), scheduler_client(rendered, tmp_path), "evil.example.com")


def test_a_caller_without_a_client_certificate_is_refused(tmp_path: Path) -> None:
    rendered = render()
    client = scheduler_client(rendered, tmp_path, with_certificate=False)
    with pytest.raises(ssl.SSLError):
        handshake(extender_server(rendered, tmp_path), client, SERVICE_HOST)


def test_a_client_certificate_of_another_release_is_refused(tmp_path: Path) -> None:
    ours, theirs = render(), render()
    server = extender_server(ours, tmp_path / "ours")
    with pytest.raises(ssl.SSLError):
        handshake(server, scheduler_client(theirs, tmp_path / "theirs"), SERVICE_HOST)


def test_all_chart_certificates_share_one_ca() -> None:
    rendered = render()
    secrets = [s for s in rendered.all("Secret") if s["metadata"]["name"].endswith("-tls")]
    assert sorted(s["metadata"]["name"] for s in secrets) == [
        f"{EXTENDER}-tls",
        f"{SCHEDULER}-client-tls",
        f"{PREFIX}-webhook-tls",
    ]
    assert {s["type"] for s in secrets} == {"kubernetes.io/tls"}
    assert len({s["data"]["ca.crt"] for s in secrets}) == 1
    assert len({s["data"]["tls.crt"] for s in secrets}) == 3


def test_pods_roll_when_the_certificates_change() -> None:
    # Offline renders cannot look the existing Secrets up, so each one makes new certificates.
    def checksums(rendered: Rendered) -> tuple[str, str]:
        annotations = [
            rendered.get("Deployment", name)["spec"]["template"]["metadata"]["annotations"]["checksum/tls"]
            for name in (EXTENDER, SCHEDULER)
        ]
        return annotations[0], annotations[1]

    first, second = checksums(render()), checksums(render())
    assert first[0] != second[0] and first[1] != second[1]
    assert all(len(c) == 64 for c in first)


def test_certificate_files_are_not_world_readable() -> None:
    rendered = render()
    for name in (EXTENDER, SCHEDULER):
        pod = rendered.get("Deployment", name)["spec"]["template"]["spec"]
        secrets = [v["secret"] for v in pod["volumes"] if "secret" in v]
        assert secrets and all(s["defaultMode"] == 0o440 for s in secrets)
        assert pod["securityContext"]["fsGroup"] == 65532


def test_insecure_mode_is_explicit_and_complete() -> None:
    rendered = render(VARIANTS["insecure"])
    deployment = rendered.get("Deployment", EXTENDER)
    c = container(deployment, "extender")
    args = flags(c["args"])
    assert args["insecure-serve-without-auth"] is None
    assert not {"tls-cert-file", "tls-key-file", "client-ca-file"} & set(args)
    assert "volumes" not in deployment["spec"]["template"]["spec"]
    stanza = scheduler_stanza(rendered)
    assert stanza["urlPrefix"] == f"http://{SERVICE_HOST}:3456/gpumgr"
    assert stanza["enableHTTPS"] is False and "tlsConfig" not in stanza
    names = [s["metadata"]["name"] for s in rendered.all("Secret")]
    assert names == [f"{PREFIX}-webhook-tls"]
    scheduler_pod = rendered.get("Deployment", SCHEDULER)["spec"]["template"]["spec"]
    assert [v["name"] for v in scheduler_pod["volumes"]] == ["config", "tmp"]


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"scheduler": {"extenderURL": "http://10.0.0.5:3456/gpumgr"}}, "use https://"),
        (
            {
                "scheduler": {"extenderURL": "https://10.0.0.5:3456/gpumgr"},
                "extender": {"insecureServeWithoutAuth": True},
            },
            "use http://",
        ),
        ({"scheduler": {"mode": "extender-only"}}, "extender.networkPolicy.from"),
    ],
)
def test_inconsistent_security_values_fail_the_render(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=reason):
        render(values)


def test_extender_only_stanza_points_at_files_the_operator_installs() -> None:
    base = VARIANTS["extender-only"]
    values = {**base, "scheduler": {**base["scheduler"], "clientCertDir": "/srv/x"}}
    data = render(values).get("ConfigMap", f"{PREFIX}-scheduler-extender")["data"]
    (stanza,) = yaml.safe_load(data["extenders.yaml"])["extenders"]
    assert stanza["tlsConfig"] == {
        "certFile": "/srv/x/tls.crt",
        "keyFile": "/srv/x/tls.key",
        "caFile": "/srv/x/ca.crt",
        # the URL names an IP; the certificate is checked against the Service's name
        "serverName": SERVICE_HOST,
    }


# --- cert-manager ------------------------------------------------------------------------------------------


def certificates(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {c["spec"]["secretName"]: c for c in rendered.all("Certificate")}


def test_cert_manager_issues_the_secrets_the_pods_mount() -> None:
    rendered = render(VARIANTS["cert-manager"])
    assert [s for s in rendered.all("Secret") if s["metadata"]["name"].endswith("-tls")] == []
    certs = certificates(rendered)
    mounted = {
        v["secret"]["secretName"]
        for kind, name in (("Deployment", EXTENDER), ("Deployment", SCHEDULER), ("Deployment", f"{PREFIX}-webhook"))
        for v in rendered.get(kind, name)["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert mounted <= set(certs)
    server = certs[f"{EXTENDER}-tls"]["spec"]
    assert SERVICE_HOST in server["dnsNames"] and "server auth" in server["usages"]
    assert "client auth" in certs[f"{SCHEDULER}-client-tls"]["spec"]["usages"]
    # the chart's own CA chain: self-signed issuer -> CA certificate -> CA issuer -> leaf certificates
    issuers = {i["metadata"]["name"]: i["spec"] for i in rendered.all("Issuer")}
    ca_issuer = server["issuerRef"]["name"]
    ca_secret = issuers[ca_issuer]["ca"]["secretName"]
    ca_cert = certs[ca_secret]["spec"]
    assert ca_cert["isCA"] is True
    assert issuers[ca_cert["issuerRef"]["name"]] == {"selfSigned": {}}
    for cert in certs.values():
        assert cert["metadata"]["namespace"] == NAMESPACE


def test_cert_manager_with_the_operators_issuer() -> None:
    rendered = render(VARIANTS["cert-manager-issuer"])
    assert rendered.all("Issuer") == []
    refs = {c["spec"]["secretName"]: c["spec"]["issuerRef"] for c in rendered.all("Certificate")}
    assert set(refs) == {f"{EXTENDER}-tls", f"{SCHEDULER}-client-tls", f"{PREFIX}-webhook-tls"}
    assert all(r == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"} for r in refs.values())


# --- NetworkPolicy -----------------------------------------------------------------------------------------


def test_network_policy_admits_only_the_scheduler() -> None:
    rendered = render()
    policy = rendered.get("NetworkPolicy", EXTENDER)["spec"]
    extender = rendered.get("Deployment", EXTENDER)
    scheduler = rendered.get("Deployment", SCHEDULER)
    assert selects(policy["podSelector"]["matchLabels"], extender["spec"]["template"]["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    api_rule, probe_rule = policy["ingress"]
    assert api_rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    (peer,) = api_rule["from"]
    assert set(peer) == {"podSelector"}
    assert selects(peer["podSelector"]["matchLabels"], scheduler["spec"]["template"]["metadata"]["labels"])
    others = [o for o in rendered.objects if o["kind"] in {"DaemonSet", "Deployment"} and o is not scheduler]
    for other in others:
        assert not selects(peer["podSelector"]["matchLabels"], other["spec"]["template"]["metadata"]["labels"])
    # the probe port (plain /healthz and /readyz only) stays open to the kubelet
    assert probe_rule == {"ports": [{"port": "probes", "protocol": "TCP"}]}
    ports = {p["name"] for p in container(extender, "extender")["ports"]}
    assert {"https", "probes"} <= ports


def test_network_policy_in_extender_only_mode_admits_the_given_peers() -> None:
    policy = render(VARIANTS["extender-only"]).get("NetworkPolicy", EXTENDER)["spec"]
    assert policy["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]


def test_network_policy_can_be_turned_off() -> None:
    assert render({"extender": {"networkPolicy": {"enabled": False}}}).all("NetworkPolicy") == []


def _secret_of(deployment: dict[str, Any]) -> str:
    (secret,) = [v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    return str(secret)


def test_cert_manager_renewals_roll_the_extender_and_scheduler_with_reloader() -> None:
    # the extender and kube-scheduler read their certificates only at start (the webhook reloads its own)
    rendered = render({"certManager": {"enabled": True, "reloader": True}})
    for name in (EXTENDER, SCHEDULER):
        deployment = rendered.get("Deployment", name)
        assert deployment["metadata"]["annotations"] == {"secret.reloader.stakater.com/reload": _secret_of(deployment)}
    assert "annotations" not in rendered.get("Deployment", f"{PREFIX}-webhook")["metadata"]
    for values in ({}, VARIANTS["cert-manager"]):
        assert "annotations" not in render(values).get("Deployment", EXTENDER)["metadata"]
