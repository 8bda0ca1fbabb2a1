"""The agent DaemonSet: host access, the flags of `gpumgr run`, placement and probes."""

from __future__ import annotations

from typing import Any

from .support import PREFIX, VARIANTS, container, flags, host_mounts, positional, render

AGENT = f"{PREFIX}-agent"


def agent(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return render(values).get("DaemonSet", AGENT)


def test_agent_runs_with_host_pids_and_privilege() -> None:
    ds = agent()
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert container(ds, "agent")["securityContext"]["privileged"] is True
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def test_agent_default_flags() -> None:
    c = container(agent(), "agent")
    assert c["image"] == "ghcr.io/gpumgr/gpumgr:0.1.0"
    assert c["command"] == ["gpumgr"]
    assert positional(c["args"]) == ["run"]
    assert flags(c["args"]) == {
        "node-name": "$(NODE_NAME)",
        "device-plugin-dir": "/var/lib/kubelet/device-plugins",
        "vdevice-root": "/etc/gpu-manager/vm",
        "checkpoint-dir": "/etc/gpu-manager/checkpoint",
        "memory-unit-mib": "256",
        "driver-root": "/host/usr/lib/x86_64-linux-gnu",
        "nvml-lib": "/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "shim-dir": "/etc/gpu-manager/vdriver",
        "metrics-addr": "0.0.0.0:5678",
        "check-period": "30",
        "health-ignore-xids": "13,31,43,45,68,109",
        "temp-unhealthy": "95",
        "temp-healthy": "90",
        "label-prefix": "gpumgr.io/",
        "proc-root": "/host/proc",
        "mode": "device-plugin",
        "log-level": "info",
    }


def test_node_name_comes_from_the_downward_api() -> None:
    env = {e["name"]: e for e in container(agent(), "agent")["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_agent_host_paths() -> None:
    mounts = {host: (inside, ro) for host, inside, ro in host_mounts(agent(), "agent")}
    assert mounts == {
        # written by the agent, and seen at the host path so that Allocate can hand host paths to the kubelet
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", False),
        "/etc/gpu-manager/vm": ("/etc/gpu-manager/vm", False),
        "/etc/gpu-manager/checkpoint": ("/etc/gpu-manager/checkpoint", False),
        "/etc/gpu-manager/vdriver": ("/etc/gpu-manager/vdriver", False),
        "/dev": ("/dev", False),
        # only read
        "/usr/lib/x86_64-linux-gnu": ("/host/usr/lib/x86_64-linux-gnu", True),
        "/sys/fs/cgroup": ("/sys/fs/cgroup", True),
        "/proc": ("/host/proc", True),
    }


def test_flag_paths_are_the_mounted_host_paths() -> None:
    values = {
        "agent": {
            "paths": {
                "devicePluginDir": "/data/kubelet/device-plugins",
                "vdeviceRoot": "/opt/gpumgr/vm",
                "checkpointDir": "/opt/gpumgr/checkpoint",
                "shimDir": "/opt/gpumgr/vdriver",
                "driverRoot": "/usr/lib64",
                "procRoot": "/proc",
            }
        }
    }
    ds = agent(values)
    args = flags(container(ds, "agent")["args"])
    mounts = {host: inside for host, inside, _ in host_mounts(ds, "agent")}
    for flag in ("device-plugin-dir", "vdevice-root", "checkpoint-dir", "shim-dir"):
        path = args[flag]
        assert path is not None and mounts[path] == path, flag
    assert args["driver-root"] == "/host/usr/lib64"
    assert mounts["/usr/lib64"] == "/host/usr/lib64"
    assert mounts["/proc"] == args["proc-root"] == "/host/proc"


def test_values_reach_the_agent_flags() -> None:
    values = {
        "agent": {
            "logLevel": "debug",
            "memoryUnitMiB": 512,
            "labelPrefix": "gpu.example.com/",
            "health": {"checkPeriod": 10, "ignoreXids": [13, 43], "tempUnhealthy": 88, "tempHealthy": 80},
        },
        "metrics": {"bindAddress": "127.0.0.1", "port": 9400},
    }
    c = container(agent(values), "agent")
    args = flags(c["args"])
    assert args["log-level"] == "debug"
    assert args["memory-unit-mib"] == "512"
    assert args["label-prefix"] == "gpu.example.com/"
    assert (args["check-period"], args["health-ignore-xids"]) == ("10", "13,43")
    assert (args["temp-unhealthy"], args["temp-healthy"]) == ("88", "80")
    assert args["metrics-addr"] == "127.0.0.1:9400"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]


def test_cdi_flag_only_when_enabled() -> None:
    assert "cdi" not in flags(container(agent(), "agent")["args"])
    assert flags(container(agent(VARIANTS["cdi"]), "agent")["args"])["cdi"] is None


def test_empty_xid_list_means_no_ignored_xids() -> None:
    args = flags(container(agent({"agent": {"health": {"ignoreXids": []}}}), "agent")["args"])
    assert args["health-ignore-xids"] == ""


def test_kubeconfig_flag_only_when_set() -> None:
    assert "kubeconfig" not in flags(container(agent(), "agent")["args"])
    ds = agent(VARIANTS["operator-extras"])
    c = container(ds, "agent")
    assert flags(c["args"])["kubeconfig"] == "/etc/gpumgr/kubeconfig"
    assert {"name": "kubeconfig", "mountPath": "/etc/gpumgr", "readOnly": True} in c["volumeMounts"]
    assert {"name": "kubeconfig", "secret": {"secretName": "gpumgr-kubeconfig"}} in ds["spec"]["template"]["spec"][
        "volumes"
    ]


def test_default_placement() -> None:
    pod = agent()["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in pod
    resources = container(agent(), "agent")["resources"]
    assert resources["requests"] == {"cpu": "100m", "memory": "128Mi"}


def test_custom_placement_replaces_the_defaults() -> None:
    ds = agent(VARIANTS["custom-placement"])
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role/gpu": "a100"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}]
    assert "priorityClassName" not in pod
    assert container(ds, "agent")["resources"] == {
        "requests": {"cpu": "250m", "memory": "200Mi"},
        "limits": {"memory": "1Gi"},
    }


def test_a_node_selector_adds_to_the_default_one() -> None:
    pod = agent({"agent": {"nodeSelector": {"gpu-model": "a100"}}})["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu-model": "a100"}


def test_empty_node_selector_runs_everywhere() -> None:
    pod = agent({"agent": {"nodeSelector": None}})["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod


def test_operator_extras() -> None:
    ds = agent(VARIANTS["operator-extras"])
    pod = ds["spec"]["template"]["spec"]
    c = container(ds, "agent")
    assert c["image"] == "ghcr.io/gpumgr/gpumgr:0.2.0-rc1"
    assert c["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["runtimeClassName"] == "nvidia"
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "20%"}
    assert ds["metadata"]["labels"]["team"] == "ml-platform"


def test_probes_hit_the_metrics_port() -> None:
    c = container(agent({"metrics": {"port": 9400}}), "agent")
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    liveness, readiness = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    assert port_names[liveness["port"]] == port_names[readiness["port"]] == 9400


def test_daemonset_selects_its_own_pods() -> None:
    ds = agent({"agent": {"podLabels": {"extra": "label"}}})
    selector = ds["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert labels["extra"] == "label"
    assert selector["app.kubernetes.io/component"] == "agent"
