"""Scheduler configuration: the second-scheduler profile, or the stanza for the default scheduler."""

from __future__ import annotations

import re
from typing import Any

import yaml

from .support import NAMESPACE, PREFIX, VARIANTS, Rendered, container, flags, render

SCHEDULER = f"{PREFIX}-scheduler"
EXPECTED_STANZA_KEYS = {
    "urlPrefix",
    "filterVerb",
    "prioritizeVerb",
    "bindVerb",
    "weight",
    "enableHTTPS",
    "httpTimeout",
    "nodeCacheCapable",
    "ignorable",
    "managedResources",
    "tlsConfig",
}


def scheduler_config(rendered: Rendered) -> dict[str, Any]:
    data = rendered.get("ConfigMap", SCHEDULER)["data"]
    assert set(data) == {"config.yaml"}
    config: dict[str, Any] = yaml.safe_load(data["config.yaml"])
    return config


def check_stanza(extender: dict[str, Any], url: str, cert_dir: str = "/etc/gpumgr-scheduler/tls") -> None:
    assert set(extender) == EXPECTED_STANZA_KEYS
    assert extender["urlPrefix"] == url
    # secure by default: HTTPS, the scheduler's client certificate, the CA that signed the extender's
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "certFile": f"{cert_dir}/tls.crt",
        "keyFile": f"{cert_dir}/tls.key",
        "caFile": f"{cert_dir}/ca.crt",
        "serverName": f"{PREFIX}-extender.{NAMESPACE}.svc",
    }
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert extender["httpTimeout"] == "30s"
    assert extender["weight"] == 1
    assert extender["managedResources"] == [
        {"name": "tencent.com/vcuda-core", "ignoredByScheduler": False},
        {"name": "tencent.com/vcuda-memory", "ignoredByScheduler": False},
    ]


def test_profile_mode_configuration() -> None:
    config = scheduler_config(render())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": "gpumgr-scheduler"}]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceNamespace": NAMESPACE,
        "resourceName": "gpumgr-scheduler",
    }
    (extender,) = config["extenders"]
    check_stanza(extender, f"https://{PREFIX}-extender.{NAMESPACE}.svc:3456/gpumgr")
    # the API client above kube-scheduler's own 50/100, which throttles DRA pods' two writes (claim + Binding)
    assert config["clientConnection"] == {"qps": 200, "burst": 400}
    assert config["percentageOfNodesToScore"] == 0  # kube-scheduler's adaptive share


def test_nodes_to_score_is_a_value() -> None:
    config = scheduler_config(render({"scheduler": {"percentageOfNodesToScore": 10}}))
    assert config["percentageOfNodesToScore"] == 10


def test_client_rate_is_a_value_in_both_modes() -> None:
    rate = {"qps": 75.5, "burst": 150}
    profile = scheduler_config(render({"scheduler": {"clientConnection": rate}}))
    assert profile["clientConnection"] == rate
    rendered = render({**VARIANTS["extender-only"], "scheduler": {**VARIANTS["extender-only"]["scheduler"],
                                                                 "clientConnection": rate}})
    data = rendered.get("ConfigMap", f"{PREFIX}-scheduler-extender")["data"]
    full = yaml.safe_load(data["kube-scheduler-config.yaml"])
    assert full["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf", **rate}


def test_stanza_url_points_at_the_extender_service() -> None:
    values = {"extender": {"port": 8080, "urlPrefix": "/x"}}
    rendered = render(values)
    (extender,) = scheduler_config(rendered)["extenders"]
    service = rendered.get("Service", f"{PREFIX}-extender")
    match = re.fullmatch(r"https://([^.]+)\.([^.]+)\.svc:(\d+)(/.*)", extender["urlPrefix"])
    assert match, extender["urlPrefix"]
    assert match.group(1, 2) == (service["metadata"]["name"], service["metadata"]["namespace"])
    assert int(match.group(3)) == service["spec"]["ports"][0]["port"] == 8080
    assert match.group(4) == "/x"


def test_stanza_values() -> None:
    values = {
        "scheduler": {
            "name": "gpu-scheduler",
            "weight": 5,
            "httpTimeout": "1m30s",
            "ignorable": True,
            "extenderURL": "https://gpumgr.example.com/gpumgr",
        }
    }
    config = scheduler_config(render(values))
    (extender,) = config["extenders"]
    assert (extender["weight"], extender["httpTimeout"], extender["ignorable"]) == (5, "1m30s", True)
    assert extender["urlPrefix"] == "https://gpumgr.example.com/gpumgr"
    assert extender["enableHTTPS"] is True
    assert config["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    assert config["leaderElection"]["resourceName"] == "gpu-scheduler"


def test_scheduler_deployment_runs_that_configuration() -> None:
    rendered = render()
    deployment = rendered.get("Deployment", SCHEDULER)
    c = container(deployment, "kube-scheduler")
    assert c["command"][0] == "kube-scheduler"
    config_path = flags(c["command"])["config"]
    assert config_path is not None
    mount = next(m for m in c["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = rendered.get("ConfigMap", volume["configMap"]["name"])
    assert config_path.removeprefix(mount["mountPath"] + "/") in configmap["data"]
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["livenessProbe"]["httpGet"]["port"] == "https"
    assert {"name": "https", "containerPort": 10259, "protocol": "TCP"} in c["ports"]


def test_scheduler_restarts_when_its_configuration_changes() -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = render(values).get("Deployment", SCHEDULER)
        annotation: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return annotation

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"scheduler": {"weight": 2}})


def test_scheduler_image_defaults_to_the_cluster_version() -> None:
    c = container(render().get("Deployment", SCHEDULER), "kube-scheduler")
    repository, tag = c["image"].rsplit(":", 1)
    assert repository == "registry.k8s.io/kube-scheduler"
    assert re.fullmatch(r"v1\.\d+\.\d+", tag), tag
    pinned = render(VARIANTS["operator-extras"]).get("Deployment", SCHEDULER)
    assert container(pinned, "kube-scheduler")["image"] == "registry.k8s.io/kube-scheduler:v1.31.4"
    assert pinned["spec"]["replicas"] == 2


def test_extender_only_mode_renders_just_the_stanza() -> None:
    rendered = render(VARIANTS["extender-only"])
    # only the stanza, and the client certificate the operator copies to the control-plane hosts
    assert not [
        o for o in rendered.objects if "scheduler" in o["metadata"]["name"] and o["kind"] not in {"ConfigMap", "Secret"}
    ]
    assert rendered.get("Secret", f"{PREFIX}-scheduler-client-tls")["type"] == "kubernetes.io/tls"
    assert sorted(o["metadata"]["name"] for o in rendered.all("Deployment")) == [
        f"{PREFIX}-extender",
        f"{PREFIX}-webhook",
    ]
    data = rendered.get("ConfigMap", f"{PREFIX}-scheduler-extender")["data"]
    stanza = yaml.safe_load(data["extenders.yaml"])
    assert set(stanza) == {"extenders"}
    (extender,) = stanza["extenders"]
    check_stanza(extender, "https://10.96.0.50:3456/gpumgr", cert_dir="/etc/kubernetes/gpumgr")
    full = yaml.safe_load(data["kube-scheduler-config.yaml"])
    assert full["kind"] == "KubeSchedulerConfiguration"
    assert full["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert full["extenders"] == stanza["extenders"]
    assert full["profiles"] == [{"schedulerName": "default-scheduler"}]
    assert f"configmap {PREFIX}-scheduler-extender" in rendered.notes


def test_notes_tell_users_how_to_reach_the_scheduler() -> None:
    assert "schedulerName: gpumgr-scheduler" in render().notes
    extender_only = {"scheduler": {"mode": "extender-only"}, "extender": {"networkPolicy": {"enabled": False}}}
    assert "set scheduler.extenderURL" in render(extender_only).notes
