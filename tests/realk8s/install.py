"""gpumgr installed on a real test cluster the way users install it: the chart rendered with the Helm SDK (as
`helm template`/`helm install` would), its objects applied to the API server, and the components the chart would
run in pods started as host processes instead (the fake runtime runs no container), each with its own
ServiceAccount's token and the arguments the chart renders for it. What must differ for a host process is
translated here, and only that:

- host paths the agent's DaemonSet mounts -> directories of the test (the device-plugin directory is the real
  /var/lib/kubelet/device-plugins, seen from the node's mount namespace);
- listen addresses -> 127.0.0.1 and free ports; the scheduler's extender URL -> `scheduler.extenderURL` value,
  the port of a stand-in for the extender's Service (tests/realk8s/service.py: to the pod its selector matches);
- the certificate files the Secrets would mount -> the same bytes written to disk;
- the webhook: the API server cannot reach a Service without kube-proxy, and endpoints may not be loopback, so its
  clientConfig is a URL with a serving certificate for 127.0.0.1 from a CA of the test (caBundle set to it).
"""

from __future__ import annotations

import base64
import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.chart.support import NAMESPACE, PREFIX, Rendered, container, render
from tests.realk8s import pki
from tests.realk8s.cluster import Cluster, Node
from tests.realk8s.procs import Proc, free_port, wait_for
from tests.realk8s.service import ServiceProxy

SKIPPED_KINDS = {"DaemonSet", "Deployment"}  # run as host processes instead
# The ConfigMap with the CA of the API server's webhook client certificate (webhook.clientCA.configMap), created
# as docs/webhook.md says: here the cluster CA signed that certificate (Cluster._admission_config).
WEBHOOK_CLIENT_CA = "apiserver-webhook-client-ca"
MIG_CLASS = "mig.gpumgr.io"  # the DeviceClass of MIG instances made at claim time


def chart_values(extender_port: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values a user of this cluster gives: the extender's Service reachable at 127.0.0.1 (there is no cluster
    DNS), the agent serving both front ends."""
    values: dict[str, Any] = {
        "scheduler": {"extenderURL": f"https://127.0.0.1:{extender_port}/gpumgr"},
        "agent": {"mode": "both"},
        "dra": {"deviceClasses": {"mig": MIG_CLASS}},  # the node with MIG cards (test_mig.py)
        "webhook": {"clientCA": {"configMap": WEBHOOK_CLIENT_CA}},
    }
    return _merge(values, extra or {})


def apply(cluster: Cluster, rendered: Rendered, webhook_ca: pki.Authority, webhook_port: int) -> list[str]:
    """Create every rendered object but the workloads; returns "Kind/name" of what was created."""
    from kubernetes import client as k
    from kubernetes import dynamic

    api_client = cluster.client()
    core = k.CoreV1Api(api_client)
    try:
        core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=NAMESPACE)))
    except k.ApiException as error:
        if error.status != 409:
            raise
    if webhook_client_ca(rendered) is not None:
        core.create_namespaced_config_map(NAMESPACE, k.V1ConfigMap(
            metadata=k.V1ObjectMeta(name=WEBHOOK_CLIENT_CA), data={"ca.crt": cluster.ca.ca_file.read_text()}))
    dyn = dynamic.DynamicClient(api_client)
    created = []
    for obj in rendered.objects:
        if obj["kind"] in SKIPPED_KINDS:
            continue
        obj = copy.deepcopy(obj)
        if obj["kind"] == "MutatingWebhookConfiguration":
            for hook in obj["webhooks"]:
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{webhook_port}{hook['clientConfig']['service']['path']}",
                    "caBundle": base64.b64encode(webhook_ca.ca_file.read_bytes()).decode(),
                }
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace") or (NAMESPACE if resource.namespaced else None)
        resource.create(body=obj, namespace=namespace)
        created.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return created


def webhook_client_ca(rendered: Rendered) -> str | None:
    """The ConfigMap the rendered webhook Deployment takes its --client-ca-file from, if any."""
    for obj in rendered.all("Deployment"):
        if obj["metadata"]["name"] == f"{PREFIX}-webhook":
            for volume in obj["spec"]["template"]["spec"].get("volumes", []):
                if "configMap" in volume:
                    return str(volume["configMap"]["name"])
    return None


@dataclass
class Gpumgr:
    """The chart's components on a test cluster."""

    cluster: Cluster
    rendered: Rendered
    workdir: Path
    extender_port: int
    webhook_port: int
    webhook_ca: pki.Authority
    agents: dict[str, Proc] = field(default_factory=dict)
    agent_metrics: dict[str, int] = field(default_factory=dict)
    extenders: list[Proc] = field(default_factory=list)
    extender_ports: dict[str, int] = field(default_factory=dict)  # replica's pod name -> its own listen port
    service: ServiceProxy | None = None  # the extender's Service: routes to the pod labelled leader
    webhook: Proc | None = None
    webhook_probe_port: int = 0
    scheduler: Proc | None = None

    def name(self, component: str) -> str:
        return f"{PREFIX}-{component}"

    def secret_file(self, secret: str, key: str) -> Path:
        data = self.rendered.get("Secret", secret)["data"][key]
        out = self.workdir / "secrets" / secret
        out.mkdir(parents=True, exist_ok=True)
        (out / key).write_bytes(base64.b64decode(data))
        return out / key

    def kubeconfig_for(self, component: str, node: str | None = None) -> Path:
        sa = self.name(component)
        token = self.cluster.token(NAMESPACE, sa, node=node)
        suffix = f"-{node}" if node else ""
        return self.cluster.kubeconfig_with_token(self.workdir / f"{component}{suffix}.kubeconfig", token)

    # ---- agent ---------------------------------------------------------------------------------------------

    def agent_args(self, node: Node, spec: Path) -> list[str]:
        rendered = container(self.rendered.get("DaemonSet", self.name("agent")), "agent")["args"]
        base = node.dir / "agent"
        for sub in ("vm", "checkpoint", "vdriver", "driver-root", "dev", "cdi"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.agent_metrics[node.name] = port
        paths = {
            "--node-name": node.name,
            "--vdevice-root": str(base / "vm"), "--checkpoint-dir": str(base / "checkpoint"),
            "--shim-dir": str(base / "vdriver"), "--driver-root": str(base / "driver-root"),
            "--metrics-addr": f"127.0.0.1:{port}", "--proc-root": "/proc", "--cdi-dir": str(base / "cdi"),
            "--dra-plugin-dir": str(node.root_dir / "plugins" / "vgpu.gpumgr.io"),
            "--plugins-registry-dir": str(node.root_dir / "plugins_registry"),
        }
        args = []
        for arg in rendered:
            flag, sep, _ = arg.partition("=")
            if flag == "--nvml-lib":
                continue  # the simulated backend loads no NVML
            args.append(f"{flag}={paths[flag]}" if sep and flag in paths else arg)
        from gpumgr.sim.node import shim_source_for

        return [*args, f"--kubeconfig={self.kubeconfig_for('agent', node.name)}", f"--simulate={spec}",
                f"--dev-root={base / 'dev'}", f"--shim-source={shim_source_for(base)}"]

    def start_agent(self, node: Node, spec: Path) -> Proc:
        args = self.agent_args(node, spec)
        proc = node.run_in_namespace(f"{node.name}-agent", [sys.executable, "-m", "gpumgr.cli", *args], restart=True)
        self.agents[node.name] = proc
        return proc

    # ---- extender, scheduler, webhook ----------------------------------------------------------------------

    def extender_args(self, listen_port: int, probe_port: int) -> list[str]:
        name = self.name("extender")
        rendered = container(self.rendered.get("Deployment", name), "extender")["args"]
        tls = self.rendered_tls_secret("extender")
        paths = {
            "--listen": f"127.0.0.1:{listen_port}", "--probe-listen": f"127.0.0.1:{probe_port}",
            "--tls-cert-file": str(self.secret_file(tls, "tls.crt")),
            "--tls-key-file": str(self.secret_file(tls, "tls.key")),
            "--client-ca-file": str(self.secret_file(tls, "ca.crt")),
        }
        args = [f"{a.partition('=')[0]}={paths[a.partition('=')[0]]}" if a.partition("=")[0] in paths else a
                for a in rendered]
        return [*args, f"--kubeconfig={self.kubeconfig_for('extender')}"]

    def start_extender(self, replica: int = 0) -> Proc:
        probe = free_port()
        pod_name = f"{self.name('extender')}-{replica}"
        self._stand_in_pod(pod_name, self.rendered.get("Deployment", self.name("extender")))
        self.extender_ports[pod_name] = listen = free_port()
        if self.service is None:
            selector = self.rendered.get("Service", self.name("extender"))["spec"]["selector"]
            api_client = self.cluster.client()
            self.service = ServiceProxy(self.extender_port, selector, NAMESPACE, lambda: api_client,
                                        self.extender_ports).start()
        env = {**_env(), "POD_NAME": pod_name, "POD_NAMESPACE": NAMESPACE}
        proc = Proc(f"extender-{replica}", [sys.executable, "-m", "gpumgr.cli", *self.extender_args(listen, probe)],
                    self.cluster.logs, env=env, restart=True).start()
        self.cluster.procs.append(proc)
        self.extenders.append(proc)
        return proc

    def _stand_in_pod(self, name: str, workload: dict[str, Any]) -> None:
        """The pod object a Deployment would have made for a replica (the leader labels its own pod), with its
        template's labels; no scheduler picks it up (the process runs on the host instead)."""
        from kubernetes import client as k

        core = k.CoreV1Api(self.cluster.client())
        labels = workload["spec"]["template"]["metadata"]["labels"]
        body = {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                "spec": {"schedulerName": "runs-on-the-test-host", "automountServiceAccountToken": False,
                         "containers": [{"name": "stand-in", "image": "registry.k8s.io/pause:3.10"}]}}
        try:
            core.create_namespaced_pod(NAMESPACE, body)
        except k.ApiException as error:
            if error.status != 409:
                raise

    def start_scheduler(self) -> Proc:
        """kube-scheduler as the chart's second scheduler: its ConfigMap's configuration, its ServiceAccount."""
        config_map = self.rendered.get("ConfigMap", self.name("scheduler"))
        config = yaml.safe_load(config_map["data"]["config.yaml"])
        tls = self.rendered_tls_secret("scheduler")
        for stanza in config["extenders"]:
            tls_config = stanza["tlsConfig"]
            for key, file in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt")):
                assert Path(tls_config[key]).name == file, tls_config
                tls_config[key] = str(self.secret_file(tls, file))
        kubeconfig = self.kubeconfig_for("scheduler")
        config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)  # the chart's qps/burst stay
        path = self.workdir / "gpumgr-scheduler.yaml"
        path.write_text(yaml.safe_dump(config))
        scheduler = container(self.rendered.get("Deployment", self.name("scheduler")), "kube-scheduler")
        flags = [f for f in scheduler["command"][1:] if not f.startswith("--config=")]
        proc = Proc("gpumgr-scheduler", [str(self.cluster.bin / "kube-scheduler"), f"--config={path}", *flags,
                                         "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                                         f"--authentication-kubeconfig={kubeconfig}",
                                         f"--authorization-kubeconfig={kubeconfig}"],
                    self.cluster.logs, restart=True).start()
        self.cluster.procs.append(proc)
        self.scheduler = proc
        return proc

    def start_webhook(self) -> Proc:
        name = self.name("webhook")
        rendered = container(self.rendered.get("Deployment", name), "webhook")["args"]
        serving = self.webhook_ca.issue("webhook-serving", f"{name}.{NAMESPACE}.svc", server=True,
                                        hosts=("127.0.0.1", f"{name}.{NAMESPACE}.svc"))
        # --client-ca-file: the ConfigMap's ca.crt (WEBHOOK_CLIENT_CA), which is the cluster CA's certificate
        assert webhook_client_ca(self.rendered) == WEBHOOK_CLIENT_CA
        self.webhook_probe_port = free_port()
        paths = {"--listen": f"127.0.0.1:{self.webhook_port}", "--tls-cert-file": str(serving.cert),
                 "--tls-key-file": str(serving.key), "--client-ca-file": str(self.cluster.ca.ca_file),
                 "--probe-listen": f"127.0.0.1:{self.webhook_probe_port}"}
        args = [f"{a.partition('=')[0]}={paths[a.partition('=')[0]]}" if a.partition("=")[0] in paths else a
                for a in rendered]
        proc = Proc("webhook", [sys.executable, "-m", "gpumgr.cli", *args], self.cluster.logs, env=_env(),
                    restart=True).start()
        self.cluster.procs.append(proc)
        self.webhook = proc
        wait_http(f"http://127.0.0.1:{self.webhook_probe_port}/healthz", "the webhook's probe port", proc)
        return proc

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()

    def rendered_tls_secret(self, component: str) -> str:
        workload = self.rendered.get("Deployment", self.name(component))
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in volume:
                return str(volume["secret"]["secretName"])
        raise AssertionError(f"{component}: no Secret volume in the rendered Deployment")


def install(cluster: Cluster, workdir: Path, extra_values: dict[str, Any] | None = None) -> Gpumgr:
    extender_port, webhook_port = free_port(), free_port()
    rendered = render(chart_values(extender_port, extra_values))
    webhook_ca = pki.Authority(workdir / "webhook-pki", "gpumgr-webhook-test-ca")
    apply(cluster, rendered, webhook_ca, webhook_port)
    return Gpumgr(cluster, rendered, workdir, extender_port, webhook_port, webhook_ca)


def _server_version(cluster: Cluster) -> str:
    from kubernetes import client as k

    info = k.VersionApi(cluster.client()).get_code()
    return str(info.git_version).lstrip("v")


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def wait_http(url: str, what: str, proc: Proc) -> None:
    import urllib.request

    wait_for(what, lambda: urllib.request.urlopen(url, timeout=2).status == 200, 60, procs=(proc,))
