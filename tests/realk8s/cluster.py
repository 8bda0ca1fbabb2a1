"""A real Kubernetes cluster on loopback for tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and any number of real kubelets on the fake CRI runtime. Real TLS everywhere, service-account tokens,
`--authorization-mode=Node,RBAC`, NodeRestriction and the default admission plugins.

API (also for benchmarks that need only a control plane):

    bins = build.ensure_binaries()                  # tests/realk8s/build.py
    cluster = Cluster(workdir, bins)                # workdir: an empty temporary directory
    cluster.start_control_plane(scheduler_config=None, node_lifecycle=True)
        # scheduler_config: text of a KubeSchedulerConfiguration (its clientConnection is set here) or None
        # node_lifecycle=False: controller-manager without the node-lifecycle controller (nodes with no
        # kubelet stay untainted)
    cluster.admin_kubeconfig                        # Path: system:masters client certificate
    cluster.client()                                # kubernetes.client.ApiClient as admin
    node = cluster.add_node("node-a", labels={...}) # a real kubelet + fakecri in its own mount namespace
    node.records()                                  # CreateContainer requests the kubelet made (list of dicts)
    node.run_in_namespace(proc_name, args, restart=False)  # a Proc in the node's mount namespace (restart=True:
                                                    # started again when it exits, as a pod's container)
    cluster.add_fake_nodes(["n1", ...], capacity={"cpu": "64", ...}, labels={...})  # Node objects, no kubelet
    cluster.token("ns", "sa", node="node-a")        # a TokenRequest token (bound to the Node if given)
    cluster.kubeconfig_with_token(path, token)      # a kubeconfig a component uses with that token
    cluster.restart_apiserver(); cluster.stop()     # stop() leaves no process, whatever failed

Each kubelet and whatever runs with it lives in a private mount namespace where a directory of the test is bind
mounted over /var/lib/kubelet/device-plugins (the kubelet hard-codes that path), so two clusters or two nodes on
one machine never share it.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.realk8s import pki
from tests.realk8s.procs import Proc, free_port, wait_for

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_S = 120.0


class Cluster:
    def __init__(self, workdir: Path, bin_dir: Path):
        self.workdir = workdir
        self.bin = bin_dir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pki_dir = workdir / "pki"
        self.ca = pki.Authority(self.pki_dir)
        self.procs: list[Proc] = []
        self.nodes: dict[str, Node] = {}
        self.api_port = 0
        self.admin_kubeconfig = workdir / "admin.kubeconfig"
        self._apiserver: Proc | None = None

    # ---- control plane -------------------------------------------------------------------------------------

    def start_control_plane(self, scheduler_config: str | None = None, node_lifecycle: bool = True) -> None:
        etcd_port, peer_port = free_port(), free_port()
        self.api_port = free_port()
        etcd = self._spawn("etcd", [
            shutil.which("etcd") or "etcd", "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}", "--log-level", "warn",
        ], env={**os.environ, "ETCD_UNSUPPORTED_ARCH": ""})
        serving = self.ca.issue("apiserver", "kube-apiserver", server=True, hosts=(
            "127.0.0.1", "localhost", "10.96.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"))
        to_kubelet = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                   groups=("system:masters",))
        self.sa = pki.service_account_keys(self.pki_dir)
        admin = self.ca.issue("admin", "admin", groups=("system:masters",))
        self._write_kubeconfig(self.admin_kubeconfig, cert=admin)
        admission = self._admission_config()
        self._apiserver = self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.ca.ca_file}",
            f"--service-account-key-file={self.sa.cert}", f"--service-account-signing-key-file={self.sa.key}",
            f"--service-account-issuer={ISSUER}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={to_kubelet.cert}", f"--kubelet-client-key={to_kubelet.key}",
            f"--kubelet-certificate-authority={self.ca.ca_file}",
            "--endpoint-reconciler-type=none", "--profiling=false", "--allow-privileged=true",
            f"--admission-control-config-file={admission}",
        ])
        wait_for("etcd and kube-apiserver /readyz", lambda: self._get("/readyz") == "ok", START_TIMEOUT_S,
                 procs=(etcd, self._apiserver))
        cm_conf = self.workdir / "controller-manager.kubeconfig"
        self._write_kubeconfig(cm_conf, cert=self.ca.issue("controller-manager", "system:kube-controller-manager"))
        controllers = "*" if node_lifecycle else "*,-node-lifecycle-controller"
        self._spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), *self._component_flags(cm_conf),
            f"--service-account-private-key-file={self.sa.key}", f"--root-ca-file={self.ca.ca_file}",
            f"--cluster-signing-cert-file={self.ca.ca_file}", f"--cluster-signing-key-file={self.ca.key_file}",
            "--use-service-account-credentials=true", f"--controllers={controllers}",
        ])
        sched_conf = self.workdir / "scheduler.kubeconfig"
        self._write_kubeconfig(sched_conf, cert=self.ca.issue("scheduler", "system:kube-scheduler"))
        sched_args = [str(self.bin / "kube-scheduler"), *self._component_flags(sched_conf)]
        if scheduler_config is not None:
            config = yaml.safe_load(scheduler_config)
            config.setdefault("clientConnection", {})["kubeconfig"] = str(sched_conf)
            config.setdefault("leaderElection", {})["leaderElect"] = False
            path = self.workdir / "scheduler-config.yaml"
            path.write_text(yaml.safe_dump(config))
            sched_args = [a for a in sched_args if not a.startswith(("--kubeconfig", "--leader-elect"))]
            sched_args.append(f"--config={path}")
        self._spawn("kube-scheduler", sched_args)
        wait_for("the default ServiceAccount", lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default"),
                 START_TIMEOUT_S, procs=tuple(self.procs))

    def restart_apiserver(self) -> None:
        assert self._apiserver is not None
        self._apiserver.stop()
        self._apiserver.start()
        wait_for("kube-apiserver /readyz after a restart", lambda: self._get("/readyz") == "ok", START_TIMEOUT_S,
                 procs=(self._apiserver,))

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    # ---- nodes ---------------------------------------------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Node:
        node = Node(self, name, self.workdir / "nodes" / name, labels or {})
        node.start()
        self.nodes[name] = node
        return node

    def add_fake_nodes(self, names: list[str], capacity: dict[str, str], labels: dict[str, str] | None = None) -> None:
        """Node objects with capacity and a Ready condition and no kubelet (for scheduler-only tests)."""
        from kubernetes import client as k

        api = k.CoreV1Api(self.client())
        for name in names:
            api.create_node(k.V1Node(metadata=k.V1ObjectMeta(name=name, labels=labels or {})))
            api.patch_node_status(name, {"status": {
                "capacity": capacity, "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "fake node", "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
            }})

    # ---- credentials ---------------------------------------------------------------------------------------

    def client(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.admin_kubeconfig))

    def token(self, namespace: str, service_account: str, node: str | None = None,
              expiration_s: int = 3600 * 6) -> str:
        from kubernetes import client as k

        api = k.CoreV1Api(self.client())
        bound = None
        if node is not None:
            uid = api.read_node(node).metadata.uid
            bound = k.V1BoundObjectReference(api_version="v1", kind="Node", name=node, uid=uid)
        spec = k.V1TokenRequestSpec(audiences=[ISSUER], expiration_seconds=expiration_s, bound_object_ref=bound)
        answer = api.create_namespaced_service_account_token(service_account, namespace,
                                                             k.AuthenticationV1TokenRequest(spec=spec))
        return str(answer.status.token)

    def kubeconfig_with_token(self, path: Path, token: str) -> Path:
        self._write_kubeconfig(path, token=token)
        return path

    def kubeconfig_with_cert(self, path: Path, pair: pki.Pair) -> Path:
        self._write_kubeconfig(path, cert=pair)
        return path

    # ---- teardown ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.stop()
        for proc in reversed(self.procs):
            proc.stop()

    # ---- helpers -------------------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, args, self.logs, env=env, cwd=self.workdir).start()
        self.procs.append(proc)
        return proc

    def _admission_config(self) -> Path:
        """The AdmissionConfiguration docs/installation.md tells a user to write for a webhook that requires a client
        certificate, taken from the doc's two YAML blocks so that the doc is what the real API server runs: only the
        file paths are the tier's, and the user is the doc's `'*'` (the tier's webhook is called by URL, not through
        its Service), with a certificate the cluster CA signed for the API server (`webhook_client`)."""
        self.webhook_client = self.ca.issue("apiserver-webhook-client", "kube-apiserver-webhook-client")
        admission, webhook_kubeconfig = documented_admission_config()
        kubeconfig = self.workdir / "admission-webhook.kubeconfig"
        (user,) = webhook_kubeconfig["users"]
        user["name"] = "*"
        files = {"client-certificate": self.webhook_client.cert, "client-key": self.webhook_client.key}
        user["user"] = {key: str(files[key]) for key in user["user"]}  # the doc's keys: a wrong one fails here
        kubeconfig.write_text(yaml.safe_dump(webhook_kubeconfig))
        kubeconfig.chmod(0o600)
        (plugin,) = admission["plugins"]
        plugin["configuration"]["kubeConfigFile"] = str(kubeconfig)
        path = self.workdir / "admission.yaml"
        path.write_text(yaml.safe_dump(admission))
        return path

    def _component_flags(self, kubeconfig: Path) -> list[str]:
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}", "--leader-elect=false"]

    def _write_kubeconfig(self, path: Path, cert: pki.Pair | None = None, token: str | None = None) -> None:
        user: dict[str, str] = {}
        if cert is not None:
            user = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
        if token is not None:
            user = {"token": token}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": f"https://127.0.0.1:{self.api_port}",
                                                      "certificate-authority": str(self.ca.ca_file)}}],
            "users": [{"name": "test", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }))
        path.chmod(0o600)

    def _get(self, path: str) -> str:
        context = ssl.create_default_context(cafile=str(self.ca.ca_file))
        context.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        with urllib.request.urlopen(f"https://127.0.0.1:{self.api_port}{path}", context=context, timeout=5) as r:
            return r.read().decode()


@dataclass
class Node:
    """A real kubelet on the fake CRI runtime, in a mount namespace of its own."""

    cluster: Cluster
    name: str
    dir: Path
    labels: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    kubelet: Proc | None = None
    holder: Proc | None = None

    @property
    def device_plugin_dir(self) -> Path:
        """The directory the kubelet sees as /var/lib/kubelet/device-plugins (the same files, from the host)."""
        return self.dir / "device-plugins"

    @property
    def root_dir(self) -> Path:
        return self.dir / "kubelet"

    @property
    def work_dir(self) -> Path:
        return self.dir / "cwd"

    @property
    def record_file(self) -> Path:
        return self.dir / "containers.jsonl"

    def start(self) -> None:
        for sub in ("device-plugins", "kubelet", "pod-logs", "volume-plugins", "cert", "cwd/0-guard"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.work_dir / "0-guard" / "keep").write_text("the kubelet removes entries of its working directory\n")
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        logs = self.cluster.logs
        # The namespace holder: a process whose mount namespace has the private bind mount; everything of this
        # node joins it with nsenter (so the kubelet and the agent can be restarted on their own).
        self.holder = Proc(f"{self.name}-mountns", [  # (cwd: the node's directory, as for everything below)
            "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f"mount --bind {self.device_plugin_dir} {DEVICE_PLUGIN_DIR} && exec sleep 2147483647",
        ], logs, cwd=self.work_dir).start()
        holder = self.holder
        wait_for(f"the mount namespace of {self.name}", lambda: str(DEVICE_PLUGIN_DIR) in
                 Path(f"/proc/{holder.pid}/mountinfo").read_text(), 20, procs=(holder,))
        self.fakecri = self.run_in_namespace(f"{self.name}-fakecri", [
            str(self.cluster.bin / "fakecri"), "-socket", str(self.dir / "cri.sock"), "-record",
            str(self.record_file)])
        wait_for("the fake CRI socket", lambda: (self.dir / "cri.sock").exists(), 20, procs=(self.fakecri,))
        ca = self.cluster.ca
        client = ca.issue(f"{self.name}-client", f"system:node:{self.name}", groups=("system:nodes",))
        serving = ca.issue(f"{self.name}-serving", f"system:node:{self.name}", server=True,
                           hosts=("127.0.0.1", self.name))
        kubeconfig = self.dir / "kubelet.kubeconfig"
        self.cluster.kubeconfig_with_cert(kubeconfig, client)
        self.port = free_port()
        endpoint = f"unix://{self.dir / 'cri.sock'}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": self.port, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(ca.ca_file)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
            "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failSwapOn": False, "failCgroupV1": False, "podLogsDir": str(self.dir / "pod-logs"),
            "volumePluginDir": str(self.dir / "volume-plugins"), "serializeImagePulls": False,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "maxPods": 110, "registerNode": True, "resolvConf": "",
        }
        config_file = self.dir / "kubelet-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        args = [str(self.cluster.bin / "kubelet"), f"--config={config_file}", f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}", f"--root-dir={self.root_dir}", f"--cert-dir={self.dir / 'cert'}"]
        if self.labels:
            args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        self.kubelet = self.run_in_namespace(f"{self.name}-kubelet", args)
        self.wait_ready()

    def wait_ready(self) -> None:
        from kubernetes import client as k

        api = k.CoreV1Api(self.cluster.client())

        def ready() -> bool:
            node = api.read_node(self.name)
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        assert self.kubelet is not None
        wait_for(f"node {self.name} Ready", ready, START_TIMEOUT_S, interval_s=0.5, procs=(self.kubelet,))

    def run_in_namespace(self, name: str, args: list[str], env: dict[str, str] | None = None,
                         restart: bool = False) -> Proc:
        assert self.holder is not None
        # --wd: entering a mount namespace sets the working directory to its root, and the kubelet (1.36, on the
        # fake runtime) calls os.Remove on the first entry of its working directory (seen with strace): from "/" it
        # deleted the host's /bin symlink. Every process of the node works in a directory of its own whose first
        # entry is a non-empty directory, which os.Remove cannot take.
        proc = Proc(name, ["nsenter", "-t", str(self.holder.pid), "-m", f"--wd={self.work_dir}", "--", *args],
                    self.cluster.logs, env=env, restart=restart).start()
        self.procs.append(proc)
        return proc

    def restart_kubelet(self) -> None:
        assert self.kubelet is not None
        self.kubelet.stop()
        self.kubelet.start()
        self.wait_ready()

    def records(self) -> list[dict[str, Any]]:
        if not self.record_file.exists():
            return []
        return [json.loads(line) for line in self.record_file.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        if self.holder is not None:
            self.holder.stop()


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


INSTALLATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "installation.md"
ADMISSION_HEADING = "### Requiring the API server's client certificate"


def documented_admission_config() -> tuple[dict[str, Any], dict[str, Any]]:
    """The AdmissionConfiguration and the webhook kubeconfig of docs/installation.md ("Requiring the API server's
    client certificate"), as the two YAML blocks there, in order."""
    return parse_admission_doc(INSTALLATION_DOC.read_text(), str(INSTALLATION_DOC))


def parse_admission_doc(text: str, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first two YAML blocks after ADMISSION_HEADING in `text`: an AdmissionConfiguration with one plugin, and
    a kubeconfig with one user. ValueError naming `where` and what is missing when the doc no longer shows them."""
    _, found, section = text.partition(ADMISSION_HEADING)
    if not found:
        raise ValueError(f"{where}: no section {ADMISSION_HEADING!r}")
    section = section.split("\n## ", 1)[0]  # up to the next chapter
    blocks = [part.split("```", 1)[0] for part in section.split("```yaml")[1:3]]
    if len(blocks) < 2:
        raise ValueError(f"{where}: section {ADMISSION_HEADING!r} shows {len(blocks)} YAML blocks; the "
                         "AdmissionConfiguration and its webhook kubeconfig were expected")
    docs = []
    for n, block in enumerate(blocks, 1):
        try:
            doc = yaml.safe_load(block)
        except yaml.YAMLError as e:
            raise ValueError(f"{where}: YAML block {n} of {ADMISSION_HEADING!r} does not parse: {e}") from None
        docs.append(doc if isinstance(doc, dict) else {})
    admission, kubeconfig = docs
    if admission.get("kind") != "AdmissionConfiguration" or kubeconfig.get("kind") != "Config":
        raise ValueError(f"{where}: the client-certificate section no longer shows the AdmissionConfiguration and "
                         "its webhook kubeconfig as its first two YAML blocks")
    plugins, users = admission.get("plugins"), kubeconfig.get("users")
    if not isinstance(plugins, list) or len(plugins) != 1 or not isinstance(plugins[0], dict) \
            or not isinstance(plugins[0].get("configuration"), dict):
        raise ValueError(f"{where}: the AdmissionConfiguration should configure exactly one plugin")
    if not isinstance(users, list) or len(users) != 1 or not isinstance(users[0], dict) \
            or not isinstance(users[0].get("user"), dict) or not isinstance(users[0].get("name"), str):
        raise ValueError(f"{where}: the webhook kubeconfig should name exactly one user, with its files")
    return admission, kubeconfig
