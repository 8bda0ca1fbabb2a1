"""`ExtenderServer`: the extender's HTTP server, its cluster view and the watches that feed it.

    server = ExtenderServer(kubeconfig_path_or_api_client, policy="binpack", prefix="/gpumgr",
                            tls=tls.server_context(cert, key, client_ca))   # or insecure=True (tests, demo)
    port = await server.start("127.0.0.1", 0)     # 0: any free port
    await server.wait_ready(10)                   # the first list of nodes and pods is in
    ...
    await server.stop()

With `election=ElectionSettings(...)` several replicas run and one serves: the leader of a coordination.k8s.io
Lease (`leader.Elector`); the others keep their views warm and answer the verbs 503 until they lead. Every
synced replica whose election runs is ready (`/readyz` 200); the leader labels its own pod
(`leaderlabel.LeaderLabel`) so that the Service routes to it alone. If the election loop ever ends, `/healthz`
answers 500.

An empty `api` means the in-cluster service account. Secure by default: the server refuses to start without a
TLS context that requires client certificates, unless `insecure=True` is given (logged as a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
from typing import Any

from gpumgr.extender.binder import DEFAULT_SCHEDULER, Binder
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.kubeaccess import CALL_TIMEOUT, KubeAccess
from gpumgr.extender.leader import ElectionSettings, Elector
from gpumgr.extender.leaderlabel import LeaderLabel
from gpumgr.extender.podcalls import PodCalls
from gpumgr.extender.score import POLICIES
from gpumgr.extender.slim import slim_pod
from gpumgr.extender.watcher import Watcher
from gpumgr.requests import podspec
from gpumgr.requests.choices import ANN_CORDON
from gpumgr.requests.claim_results import DriverResult, claim_uid, driver_results
from gpumgr.requests.mig_ask import mig_asks
from gpumgr.serving.body import Limits
from gpumgr.serving.tls import requires_client_certs

DRA_CLAIMS = ("auto", "on", "off")
DRA_DRIVER = "vgpu.gpumgr.io"  # gpumgr.dra.config.DRIVER_NAME
SETTLE_TIMEOUT = 2 * CALL_TIMEOUT  # seconds a stopping leader waits for its binds: two API calls' worth
BUSY_BODY = b'{"Error":"the gpumgr extender has too many open connections; try again"}'
log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/gpumgr"
INSECURE_WARNING = ("serving WITHOUT client authentication (--insecure-serve-without-auth): anyone who can reach "
                    "this port can filter, prioritize and bind pods; use only for demos and tests")


class ExtenderServer:
    def __init__(self, api: Any, policy: str = "binpack", prefix: str = DEFAULT_PREFIX, *,
                 limits: Limits | None = None, tls: ssl.SSLContext | None = None, insecure: bool = False,
                 scheduler_name: str = DEFAULT_SCHEDULER, probe: tuple[str, int] | None = None,
                 election: ElectionSettings | None = None, dra_claims: str = "auto",
                 dra_driver: str = DRA_DRIVER):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
        if not insecure and not requires_client_certs(tls):
            raise ValueError("the extender serves only with TLS and required client certificates "
                             "(--tls-cert-file, --tls-key-file, --client-ca-file); "
                             "--insecure-serve-without-auth turns that off")
        if dra_claims not in DRA_CLAIMS:
            raise ValueError(f"unknown dra_claims {dra_claims!r} (expected one of {', '.join(DRA_CLAIMS)})")
        self.policy = policy
        self.dra_claims = dra_claims
        self.dra_driver = dra_driver
        self.prefix = normalize_prefix(prefix)
        self.limits = limits or Limits()
        self.tls = tls
        self.insecure = insecure
        self.scheduler_name = scheduler_name
        self.probe = probe
        self.probe_port: int | None = None
        self.election = election
        self.elector: Elector | None = None
        # where DRA claims are counted, kube-scheduler's DRA allocator places on the same nodes: break ties between
        # equally good cards towards the ones it takes last (docs/dra.md, "both" mode)
        self.view = ClusterView(high_first=dra_claims != "off")
        self._api = api
        self._access: KubeAccess | None = None
        self._calls: PodCalls | None = None
        self._watchers: list[Watcher] = []
        self.binder: Binder | None = None
        self._label: LeaderLabel | None = None
        self._runner: Any = None
        self._probe_runner: Any = None
        self.site: Any = None  # the CappedSite serving the verbs
        self._gc_task: asyncio.Task[None] | None = None
        self._gc_held = False

    @property
    def ready(self) -> bool:
        return self.view.ready

    async def start(self, host: str = "0.0.0.0", port: int = 3456) -> int:
        """Start the watches and the HTTP(S) server (and the probe server); returns the port listened on."""
        from gpumgr.extender.handlers import build_app, build_probe_app
        from gpumgr.serving.site import CappedSite

        if self._runner is not None:
            raise RuntimeError("the extender is already started")
        loop = asyncio.get_running_loop()
        if not self._gc_held:
            _gc_hold()
            self._gc_held = True
        try:
            access = await loop.run_in_executor(None, KubeAccess, self._api)
        except BaseException:
            self._gc_drop()
            raise
        self._access = access
        view = self.view
        self._watchers = [
            Watcher(access, "nodes", loop, _node_entry,
                    lambda items: view.replace_nodes({e[0]: e[1] for e in items}, {e[0]: e[2] for e in items}),
                    lambda kind, e: view.remove_node(e[0]) if kind == "DELETED" else view.set_node(*e)),
            Watcher(access, "pods", loop, _gpu_pod, view.replace_pods,
                    lambda kind, pod: view.remove_pod(pod) if kind == "DELETED" else view.set_pod(pod)),
        ]
        if self.dra_claims != "off":
            view.needs.add("resourceclaims")
            driver = self.dra_driver
            self._watchers.append(Watcher(
                access, "resourceclaims", loop, lambda claim: _dra_claim(claim, driver), view.replace_claims,
                lambda kind, c: view.remove_claim(c[0]) if kind == "DELETED" else view.set_claim(*c),
                optional=self.dra_claims == "auto"))
        self._gc_task = asyncio.ensure_future(self._gc_off_until_ready())
        for w in self._watchers:
            w.start()
        self._calls = PodCalls(access.configuration)
        gate = guard = health = None
        if self.election is not None:
            self._label = LeaderLabel(self._calls)
            self.elector = Elector(self.election, self._calls, on_elected=self._make_current,
                                   on_stopped=self._label.unmark)
            gate, guard, health = self.elector.refusal, self.elector.check, self.elector.failure
        binder = Binder(view, self._calls, scheduler_name=self.scheduler_name, guard=guard)
        self.binder = binder
        app = build_app(view, binder, self.policy, self.prefix, self.limits, gate, health)
        runners = []
        try:
            runner = await _runner(app, self.limits)
            runners.append(runner)
            site = CappedSite(runner, host, port, max_connections=self.limits.max_connections,
                              handshake_timeout=self.limits.header_timeout, ssl_context=self.tls, busy_body=BUSY_BODY)
            await site.start()
            if self.probe is not None:
                probe_runner = await _runner(build_probe_app(view, gate, health), self.limits)
                runners.append(probe_runner)
                probe_site = CappedSite(probe_runner, self.probe[0], self.probe[1], max_connections=16,
                                        handshake_timeout=self.limits.header_timeout, busy_body=BUSY_BODY)
                await probe_site.start()
                self.probe_port = probe_site.port
        except BaseException:
            for r in runners:
                await r.cleanup()
            await self._stop_watches()
            raise
        self._runner = runners[0]
        self._probe_runner = runners[1] if len(runners) > 1 else None
        self.site = site
        if self.elector is not None:
            self.elector.start()
        scheme = "https" if self.tls is not None else "http"
        auth = "client certificates required" if requires_client_certs(self.tls) else "NO client authentication"
        log.info("gpumgr extender listening on %s://%s:%d%s/{filter,prioritize,bind} (%s; policy %s; "
                 "scheduler %s; body limit %d bytes)", scheme, host, site.port, self.prefix, auth, self.policy,
                 self.scheduler_name, self.limits.max_body_bytes)
        if self.insecure and not requires_client_certs(self.tls):
            log.warning(INSECURE_WARNING)
        if self.probe_port is not None:
            log.info("health probes on http://%s:%d/healthz and /readyz", self.probe[0] if self.probe else "",
                     self.probe_port)
        return int(site.port)

    async def wait_ready(self, timeout: float) -> None:
        """Until the first list of nodes and pods is in; raises TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not self.view.ready:
                await asyncio.sleep(0.02)

    async def _gc_off_until_ready(self) -> None:
        """The collector is off during the first list (at 5,000 nodes it ran ~13 full passes, 2.5 s of a 25 s
        sync, over objects that all stay); once the view is ready, one pass and the view frozen out of later
        passes. A relist does not turn it off again; stop (or a failed start) turns it back on."""
        while not self.view.ready:
            await asyncio.sleep(0.02)
        gc.collect()
        gc.freeze()  # the cluster view is long-lived: keep the collector off it
        self._gc_drop()

    def _gc_drop(self) -> None:
        if self._gc_held:
            self._gc_held = False
            _gc_release()

    async def _make_current(self) -> None:
        """A new leader lists pods and nodes again (what the old leader bound is in the API, maybe not yet in
        this replica's watch), then labels its pod so that the Service routes to it."""
        await asyncio.gather(*(w.relist() for w in self._watchers))
        if self._label is not None:
            await self._label.mark()

    async def stop(self) -> None:
        """Stop binding, let requests in flight finish, hand the Lease back, stop the watches. The Lease is
        released only when no bind of this replica can still write: a bind that had to be cancelled may have
        sent a write that is still to commit, so then the Lease is left to expire."""
        elector = self.elector
        if elector is not None:
            elector.step_down()
        for attr in ("_runner", "_probe_runner"):
            runner = getattr(self, attr)
            setattr(self, attr, None)
            if runner is not None:
                await runner.cleanup()
        settled = True
        if self.binder is not None:
            settled = await self.binder.settle(SETTLE_TIMEOUT)
        if elector is not None:
            self.elector = None
            if not settled:
                log.warning("leader election: binds were still running at shutdown; Lease %s is not released but "
                            "left to expire", elector.settings.lease)
            await elector.stop(release=settled)
        await self._stop_watches()

    async def _stop_watches(self) -> None:
        task, self._gc_task = self._gc_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._gc_drop()
        watchers, self._watchers = self._watchers, []
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.stop) for w in watchers))
        access, self._access = self._access, None
        if access is not None:
            access.close()
        calls, self._calls = self._calls, None
        if calls is not None:
            await calls.close()


_gc_holders = 0  # servers still in their first list (several replicas may run in one process: tests)
_gc_was_enabled = True


def _gc_hold() -> None:
    global _gc_holders, _gc_was_enabled
    if _gc_holders == 0:
        _gc_was_enabled = gc.isenabled()
        gc.disable()
    _gc_holders += 1


def _gc_release() -> None:
    global _gc_holders
    _gc_holders -= 1
    if _gc_holders == 0 and _gc_was_enabled:
        gc.enable()


async def _runner(app: Any, limits: Limits) -> Any:
    """An AppRunner whose connections time out waiting for headers (`keepalive_timeout` is aiohttp's idle
    and first-request timer) and whose bodies are not inflated by aiohttp (`body.read_body` does it, bounded)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, auto_decompress=False,
                           keepalive_timeout=limits.header_timeout, lingering_time=1.0)
    await runner.setup()
    return runner


def normalize_prefix(prefix: str) -> str:
    """`gpumgr/` → `/gpumgr`; "" and "/" → "" (routes at /filter, ...)."""
    p = "/" + prefix.strip().strip("/")
    if any(c.isspace() or c in "{}?#" for c in p):
        raise ValueError(f"--url-prefix {prefix!r}: must be a plain URL path")
    return "" if p == "/" else p


def _node_entry(node: dict[str, Any]) -> tuple[str, str | None, str | None]:
    meta = node.get("metadata") or {}
    ann = meta.get("annotations") or {}
    return str(meta.get("name") or ""), ann.get(podspec.ANN_NODE_INVENTORY), ann.get(ANN_CORDON)


def _gpu_pod(pod: dict[str, Any]) -> dict[str, Any] | None:
    """A GPU pod as the view keeps it (`slim.slim_pod`, in the watch thread), or None for other pods."""
    try:
        return slim_pod(pod) if podspec.is_gpu_pod(pod) or _asks_mig(pod) else None
    except (ValueError, AttributeError):
        return None


def _asks_mig(pod: dict[str, Any]) -> bool:
    try:
        return bool(mig_asks(pod))
    except ValueError:
        return False


def _dra_claim(claim: dict[str, Any], driver: str) -> tuple[str, str, str, tuple[DriverResult, ...]] | None:
    """A ResourceClaim as the view keeps it (in the watch thread): (uid, namespace, name, its results of our
    driver). A claim that is not ours or not allocated has no results (a change that frees it); a malformed
    allocation counts as none, as the node refuses it; no UID: None (ignored)."""
    if not isinstance(claim, dict):
        return None
    uid = claim_uid(claim)
    if not uid:
        return None
    meta = claim.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    results = driver_results(claim, driver) or ()
    return (uid, namespace if isinstance(namespace, str) else "", name if isinstance(name, str) else "",
            results)
