"""GPU pods per second on the real kube-scheduler: the scheduler alone against gpumgr's extender and DRA.

    .venv/bin/python -m tests.bench.bench_scale [--nodes 100,500] [--pods 500 | --pods-per-node 5]
                                                [--paths abcd] [--claims pod|template] [--scheduler-qps Q]
                                                [--nodes-to-score P] [--pace 0.25 | --rate R] [--paced-pods 200]
                                                [--profile] [--sched-profile SECONDS] [--quick]
    .venv/bin/python -m tests.bench bench_scale     (as `make bench` runs it: N = 100 and 500, 500 pods per path,
                                                     then 200 paced pods per path, ~8 min;
                                                     GPUMGR_BENCH_SCALE_NODES / GPUMGR_BENCH_SCALE_PODS change them)

For each N: a real control plane (etcd, kube-apiserver, kube-controller-manager without the node-lifecycle
controller, kube-scheduler; no kubelet) from tests/realk8s, gpumgr's objects applied from the rendered chart
(webhook off: the pods name their scheduler), the extender and the chart's gpumgr-scheduler as host processes with
their ServiceAccounts' tokens; N fake nodes of 8 cards written as Node objects (capacity, inventory annotation)
and ResourceSlices (tests/bench/scale/fleet.py). Every kube-scheduler runs with the chart's client rate
(scheduler.clientConnection, 200 QPS / burst 400; --scheduler-qps Q gives all of them Q / 2Q), so the paths
compare like with like. Then, one path after the other on the same cluster (each path's pods and claims deleted
before the next), pods created as fast as the API takes them ("burst") and timed from the create request to the
watch showing spec.nodeName (tests/bench/scale/workload.py for the shapes); then every path again with fewer pods
arriving at a steady rate below the throughput ("paced": --pace F of path a's burst pods/s, or --rate R):

  a  example.com/gpu whole cards, kube-scheduler alone (the baseline)
  b  tencent.com/vcuda-* through the extender (the chart's scheduler configuration)
  c  DRA claims with consumable capacity, kube-scheduler alone on the slices
  d  both: the chart's scheduler, even pods vcuda through the extender, odd pods DRA claims

Prints one table: how the pods arrived and the schedulers' client QPS, pods/s from the first create to the last
bind, p50/p99 create->bound, pods left unbound (and
the scheduler's reason), cards over-committed at the end (from the API objects), multi-card pods on the node's
best worst link, the extender's and the schedulers' CPU seconds, the extender's peak RSS, the API server's
requests; every figure also as a ratio to path a of the same N and arrivals. --sched-profile adds a CPU profile of
kube-scheduler during paths a and c (tests/bench/scale/sched_profile.py). Asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.scale import fleet, measure, workload
from tests.bench.scale.agents import SliceFollower
from tests.bench.scale.audit import audit
from tests.bench.stats import pct

STALL_S = 20.0  # no new bind for this long after the last create: the rest stays unbound
PATH_CAP_S = 900.0
CLEAN_TIMEOUT_S = 300.0
DEFAULT_NODES = "100,500"
DEFAULT_PODS = 500
DEFAULT_PACE = 0.25
DEFAULT_PACED_PODS = 200
EMPTY_SCHEDULER_CONFIG = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default=os.environ.get("GPUMGR_BENCH_SCALE_NODES", DEFAULT_NODES),
                        help="comma list of node counts (default %(default)s)")
    parser.add_argument("--pods", type=int, default=int(os.environ.get("GPUMGR_BENCH_SCALE_PODS", DEFAULT_PODS)),
                        help="pods per path and N (default %(default)s)")
    parser.add_argument("--pods-per-node", type=int, default=0, help="instead of --pods: this many per node")
    parser.add_argument("--paths", default="abcd")
    parser.add_argument("--claims", choices=("pod", "template"), default="pod",
                        help="DRA pods: a claim created per pod (default) or ResourceClaimTemplates")
    parser.add_argument("--scheduler-qps", type=int, default=0,
                        help="every kube-scheduler's client QPS (burst twice that); 0: the chart's default")
    parser.add_argument("--nodes-to-score", type=int, default=0, metavar="PERCENT",
                        help="every scheduler's percentageOfNodesToScore (0: kube-scheduler's adaptive share)")
    parser.add_argument("--pace", type=float, default=DEFAULT_PACE,
                        help="paced round at this fraction of path a's burst pods/s (0: no paced round)")
    parser.add_argument("--rate", type=float, default=0.0, help="paced round at this many pods/s instead")
    parser.add_argument("--paced-pods", type=int, default=DEFAULT_PACED_PODS, help="pods per path, paced round")
    parser.add_argument("--quick", action="store_true", help="30 nodes, 100 pods (development)")
    parser.add_argument("--profile", action="store_true", help="record the extender with py-spy (slower)")
    parser.add_argument("--sched-profile", type=int, default=0, metavar="SECONDS",
                        help="CPU profile of kube-scheduler for this long from the start of paths a and c")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory and logs")
    args = parser.parse_args(argv if argv is not None else [])
    counts = [30] if args.quick else [int(n) for n in args.nodes.split(",") if n.strip()]
    from tests.realk8s import build

    if build.go_binary() is None or shutil.which("etcd") is None:
        print("bench_scale skipped: needs Go (to build Kubernetes once) and etcd, as the real-Kubernetes tier")
        return 0
    bins = build.ensure_binaries()
    rows: list[Row] = []
    curve_start = time.monotonic()
    rate = client_rate(args.scheduler_qps)
    for n in counts:
        pods = 100 if args.quick else (args.pods_per_node * n or args.pods)
        opts = Options(args.paths, args.claims, rate, args.pace, args.rate, args.paced_pods, args.profile,
                       args.sched_profile, args.keep, args.nodes_to_score)
        t0 = time.monotonic()
        rows += run_n(bins, n, pods, opts)
        print(f"  N={n}: {time.monotonic() - t0:.0f} s for {len(args.paths)} paths of {pods} pods", flush=True)
        if n != counts[-1]:
            print(table(rows), flush=True)  # so far: a later N that fails loses only its own rows
    print(table(rows))
    print(f"(whole curve {time.monotonic() - curve_start:.0f} s; {machine()})")
    return 0


def client_rate(qps: int) -> dict[str, float]:
    """The client rate every scheduler of the run gets: the chart's scheduler.clientConnection, or qps / 2 x qps."""
    import yaml

    if qps:
        return {"qps": qps, "burst": 2 * qps}
    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts" / "gpu-manager" / "values.yaml")
                            .read_text())
    return dict(values["scheduler"]["clientConnection"])


def run_n(bins: Path, n: int, pods: int, opts: Options) -> list[Row]:
    from tests.realk8s.cluster import Cluster

    workdir = Path(tempfile.mkdtemp(prefix="scale-", dir="/tmp"))
    cluster = Cluster(workdir, bins)
    rows: list[Row] = []
    try:
        # kube-scheduler alone (paths a and c) with the same client rate as the chart's scheduler (b and d)
        cluster.start_control_plane(EMPTY_SCHEDULER_CONFIG + f"clientConnection: {json.dumps(opts.rate)}\n"
                                    f"percentageOfNodesToScore: {opts.nodes_to_score}\n", node_lifecycle=False)
        from tests.bench.scale.gpumgr_procs import start_gpumgr

        gm, extender = start_gpumgr(cluster, workdir / "gpumgr", opts.profile,
                                    {"scheduler": {"clientConnection": opts.rate,
                                                   "percentageOfNodesToScore": opts.nodes_to_score}})
        nodes = fleet.plan(n)
        t0 = time.monotonic()
        fleet.write(cluster.client, nodes, _now())
        print(f"  N={n}: nodes and slices written in {time.monotonic() - t0:.1f} s", flush=True)
        extender.wait_nodes(n)
        by_name = {x.name: x for x in nodes}
        shapes = workload.shapes(pods)
        for path in opts.paths:  # burst: as fast as the API takes them
            rows.append(run_path(cluster, gm, extender, by_name, shapes, path, opts, 0.0))
        rate = opts.paced_rate or paced_rate(rows, opts.pace)
        shapes = workload.shapes(min(pods, opts.paced_pods), seed=22)
        for path in opts.paths if rate else "":
            rows.append(run_path(cluster, gm, extender, by_name, shapes, path, opts, rate))
        extender.stop_profile()
    finally:
        cluster.stop()
        if opts.keep:
            print(f"  kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return rows


def run_path(cluster: Any, gm: Any, extender: Any, nodes: dict[str, fleet.FakeNode],
             shapes: list[workload.Shape], path: str, opts: Options, rate: float) -> Row:
    """One path's pods (created at `rate` pods/s, 0: as fast as the API takes them) to bound or stalled, printed;
    its pods and claims deleted after."""
    from kubernetes import client as k

    from tests.bench.scale.sched_profile import SchedulerProfile

    core: Any = k.CoreV1Api(cluster.client())
    custom: Any = k.CustomObjectsApi(cluster.client())
    claims = opts.claims
    ns = f"scale-{path}" + ("-paced" if rate else "")
    _namespace(core, ns)
    if path in ("c", "d") and claims == "template":
        for t in workload.templates(shapes, ns):
            custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaimtemplates", t)
    items = [(workload.claim_body(i, s, ns) if workload.uses_claim(path, i) and claims == "pod" else None,
              workload.pod_body(path, i, s, ns, claims)) for i, s in enumerate(shapes)]
    bodies = [pod for _, pod in items]
    follower = SliceFollower(cluster.client, nodes).start() if path == "d" else None
    schedulers = {"kube-scheduler": cluster.proc("kube-scheduler"), "gpumgr-scheduler": gm.scheduler}
    measure.reset_peak_rss(extender.pid)
    cpu0 = {name: (proc.pid, measure.cpu_seconds(proc.pid)) for name, proc in schedulers.items()}
    ext0 = measure.cpu_seconds(extender.pid)
    req0 = measure.request_count(cluster._get("/metrics"))
    watch = measure.BindWatch(cluster.client, ns, follower.pod_bound if follower else None).start()
    spy = None
    if opts.sched_profile and path in ("a", "c") and not rate:
        out = Path(tempfile.gettempdir()) / f"scale-sched-{len(nodes)}-{path}.pprof"
        spy = SchedulerProfile(cluster.proc("kube-scheduler"), cluster.admin_kubeconfig, out,
                               opts.sched_profile).start()
    sent = measure.create_all(cluster.client, items, rate)
    last, seen = time.monotonic(), 0
    while len(watch.bound) < len(bodies) and time.monotonic() - last < STALL_S \
            and time.monotonic() - min(sent.values()) < PATH_CAP_S:
        time.sleep(0.5)
        if len(watch.bound) != seen:
            last, seen = time.monotonic(), len(watch.bound)
    watch.stop()
    if spy is not None:
        print(spy.finish(), flush=True)
    row = Row(n=len(nodes), path=path, pods=len(bodies), bound=len(watch.bound), rate=rate,
              qps=f"{opts.rate['qps']:g}/{opts.rate['burst']:g}"
              + (f" {opts.nodes_to_score}%" if opts.nodes_to_score else ""))
    latencies = [watch.bound[name] - sent[name] for name in watch.bound if name in sent]
    if watch.bound:
        row.pods_per_s = len(watch.bound) / max(1e-9, max(watch.bound.values()) - min(sent.values()))
        row.p50_s, row.p99_s = pct(latencies, 50), pct(latencies, 99)
    row.extender_cpu_s = measure.cpu_seconds(extender.pid) - ext0
    row.extender_rss_mib = measure.peak_rss_mib(extender.pid)
    for name, proc in schedulers.items():
        pid0, start = cpu0[name]
        if proc.pid != pid0:
            print(f"    {name} restarted during path {path}: its CPU seconds count from the restart")
            start = 0.0
        row.scheduler_cpu_s += measure.cpu_seconds(proc.pid) - start
    row.api_requests = measure.request_count(cluster._get("/metrics")) - req0
    pod_list = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]
    claim_list = custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims")["items"]
    for pod in pod_list:
        if not pod["spec"].get("nodeName"):
            cond = [c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
            row.reasons[(cond[0].get("message") or cond[0].get("reason") or "?")[:110] if cond else "not tried"] += 1
    found = audit(nodes, pod_list, claim_list)
    row.overcommitted = len(found.overcommitted)
    row.mixed = found.mixed
    row.multi_card, row.multi_card_best = found.multi_card, found.multi_card_best
    for line in found.overcommitted[:5]:
        print(f"    OVER-COMMITTED ({path}): {line}")
    if found.mixed:
        print(f"    held by a pod and a claim at once, by card: "
              f"{', '.join(f'gpu-{c} {k}' for c, k in sorted(found.race_cards.items()))}; by holders: "
              f"{', '.join(f'{w} {k}' for w, k in found.race_kinds.most_common())}")
    if follower is not None:
        follower.stop(restore=True)
        print(f"    agent stand-in: {follower.updates} slice updates")
    print(f"  N={row.n} path {path} {row.arrivals}: {row.bound}/{row.pods} bound, {row.pods_per_s:.1f} pods/s, "
          f"p50 {row.p50_s:.2f} s, p99 {row.p99_s:.2f} s, unbound: {dict(row.reasons) or '-'}", flush=True)
    _clean(cluster.client, ns)
    return row


def paced_rate(rows: list[Row], pace: float) -> float:
    """The paced round's pods/s: `pace` of path a's burst pods/s (0: no paced round, nor without path a)."""
    base = next((r for r in rows if r.path == "a" and not r.rate), None)
    if not pace:
        return 0.0
    if base is None or not base.pods_per_s:
        print("  no paced round: it paces at a fraction of path a's burst pods/s (--paths with a, or --rate)")
        return 0.0
    return round(pace * base.pods_per_s, 1)


def _namespace(core: Any, ns: str) -> None:
    from kubernetes import client as k

    from tests.realk8s.procs import wait_for

    core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=ns)))
    wait_for(f"the default ServiceAccount of {ns}", lambda: core.read_namespaced_service_account("default", ns), 60)


def _clean(make_client: Any, ns: str) -> None:
    """Delete the path's pods and claims before the next path. The bench lifts the claims' delete-protection
    finalizer itself once their pods are gone: the resourceclaim controller does it at the controller-manager's
    20 QPS, minutes for thousands of claims. A namespace that does not empty in time is reported, not fatal."""
    from kubernetes import client as k

    from tests.bench.scale.measure import CREATORS

    core: Any = k.CoreV1Api(make_client())
    custom: Any = k.CustomObjectsApi(make_client())
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    custom.delete_collection_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims")
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    while time.monotonic() < deadline:
        pods = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]
        claims = custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims")["items"]
        if not pods and not claims:
            return
        if not pods:
            names = [c["metadata"]["name"] for c in claims if c["metadata"].get("finalizers")]
            with ThreadPoolExecutor(CREATORS) as pool:
                list(pool.map(lambda name: _unprotect(custom, ns, name), names))
        time.sleep(1.0)
    print(f"    WARNING: {ns} still has pods or claims after {CLEAN_TIMEOUT_S:.0f} s; the next path shares cards")


def _unprotect(custom: Any, ns: str, name: str) -> None:
    from kubernetes import client as k

    try:
        custom.patch_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", name,
                                              {"metadata": {"finalizers": None}})
    except k.ApiException as error:
        if error.status not in (404, 409, 422):
            raise


# ---- the table ---------------------------------------------------------------------------------------------

COLUMNS = (
    ("arrivals", "arrivals", "{}"), ("sched QPS", "qps", "{}"),
    ("pods/s", "pods_per_s", "{:.1f}"), ("p50 s", "p50_s", "{:.2f}"), ("p99 s", "p99_s", "{:.2f}"),
    ("unbound", "unbound", "{}"), ("over", "over", "{}"), ("multi best", "multi", "{}"),
    ("ext CPU s", "extender_cpu_s", "{:.1f}"), ("ext RSS MiB", "extender_rss_mib", "{:.0f}"),
    ("sched CPU s", "scheduler_cpu_s", "{:.1f}"), ("API reqs", "api_requests", "{}"),
)
RATIO = {"pods_per_s", "p50_s", "p99_s", "scheduler_cpu_s", "api_requests"}
NAMES = {"a": "a scheduler alone", "b": "b extender", "c": "c DRA", "d": "d both"}


def table(rows: list[Row]) -> str:
    base = {(r.n, r.rate): r for r in rows if r.path == "a"}
    head = ["N", "path", "bound"] + [c[0] for c in COLUMNS]
    lines = []
    for r in rows:
        cells = [str(r.n), NAMES[r.path], f"{r.bound}/{r.pods}"]
        for _, attr, fmt in COLUMNS:
            value = getattr(r, attr)
            text = fmt.format(value)
            b = base.get((r.n, r.rate))
            if attr in RATIO and b is not None and r.path != "a" and getattr(b, attr):
                text += f" ({value / getattr(b, attr):.2f})"
            cells.append(text)
        lines.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |" for cells in lines]
    reasons = [f"  N={r.n} {r.path} {r.arrivals}: {count} x {why}" for r in rows for why, count in r.reasons.items()]
    return "\n".join(out + (["unbound pods, the scheduler's reason:"] + reasons if reasons else []))


def machine() -> str:
    cpus = os.cpu_count()
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    from tests.realk8s import build

    return f"{cpus} CPUs ({model}), Kubernetes {build.kube_version()}, Python {sys.version.split()[0]}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Options:
    paths: str
    claims: str  # "pod" or "template"
    rate: dict[str, float]  # every scheduler's clientConnection: qps, burst
    pace: float  # paced round at this fraction of path a's burst pods/s
    paced_rate: float  # or at this many pods/s
    paced_pods: int
    profile: bool  # the extender under py-spy
    sched_profile: int  # seconds of kube-scheduler CPU profile in paths a and c; 0: none
    keep: bool
    nodes_to_score: int = 0  # every scheduler's percentageOfNodesToScore; 0: the adaptive share


@dataclass
class Row:
    n: int
    path: str
    pods: int
    bound: int
    rate: float = 0.0  # pods/s the pods were created at; 0: as fast as the API takes them
    qps: str = ""  # the client qps/burst of the path's scheduler (and its percentageOfNodesToScore, if set)
    pods_per_s: float = 0.0
    p50_s: float = 0.0
    p99_s: float = 0.0
    extender_cpu_s: float = 0.0
    extender_rss_mib: float = 0.0
    scheduler_cpu_s: float = 0.0
    api_requests: int = 0
    overcommitted: int = 0
    multi_card: int = 0
    multi_card_best: int = 0
    mixed: int = 0
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def unbound(self) -> int:
        return self.pods - self.bound

    @property
    def arrivals(self) -> str:
        return f"paced {self.rate:g}/s" if self.rate else "burst"

    @property
    def over(self) -> str:
        """Over-committed cards; `n race` of them held by a pod and a claim at once."""
        return f"{self.overcommitted} ({self.mixed} race)" if self.mixed else str(self.overcommitted)

    @property
    def multi(self) -> str:
        return f"{self.multi_card_best}/{self.multi_card}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
