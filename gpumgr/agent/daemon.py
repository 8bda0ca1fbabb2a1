"""The node agent: wires discovery, state, recovery, the plugins, vDevice servers, health and metrics.

Start order: discover the cards; load the checkpoint; start the pod cache; serve and register the plugins (their
Allocate-side calls wait); once the pods are listed, reconcile (free, restore, restart vDevice servers) and let the
plugins hand out the ledger; publish the node's GPU inventory; then keep reconciling every check period and
whenever pods change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumgr.agent.config import AgentConfig
from gpumgr.agent.ports import ServiceConfig
from gpumgr.agent.reconcile import reconcile
from gpumgr.agent.round_pods import RoundPods
from gpumgr.agent.service import AllocationService
from gpumgr.deviceplugin.response import ResponseConfig
from gpumgr.deviceplugin.servicer import PluginServicer
from gpumgr.deviceplugin.supervisor import PluginSpec, PluginSupervisor
from gpumgr.devices.backend import Backend
from gpumgr.dra.config import mode_of
from gpumgr.health.monitor import HealthConfig, HealthMonitor
from gpumgr.kube.client import KubeClient
from gpumgr.kube.pod_cache import PodCache
from gpumgr.metrics import AgentMetrics, MetricsServer, UsageReader, build_app, parse_addr, start_http
from gpumgr.node import inventory as node_inventory
from gpumgr.node.cgroups import CgroupReader
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.labels import GAIA_MODEL_LABEL, labels_patch, node_labels
from gpumgr.node.state import NodeState, load_checkpoint
from gpumgr.requests import podspec
from gpumgr.requests.choices import CordonWatch
from gpumgr.vdevice import vdriver
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.server import VDeviceManager

if TYPE_CHECKING:
    from gpumgr.dra.frontend import DraFrontEnd
    from gpumgr.mig.agent import MigRuntime
    from gpumgr.mig.live import LiveLayout

log = logging.getLogger("gpumgr.agent")

POD_SYNC_TIMEOUT_S = 30.0
CORDON_REFRESH_S = 15.0  # how often the node's gpumgr.io/cordoned-gpus is read
CORDON_FIRST_READ_S = 5.0  # the first read at start, bounded: Allocate waits for the start to finish


class Agent:
    def __init__(self, config: AgentConfig, backend: Backend, kube: KubeClient):
        self.config = config
        self.backend = backend
        self.kube = kube
        self.state: NodeState | None = None
        self.service: AllocationService | None = None
        # the vDevice directories and servers: built once at start, handed to both front ends
        self.layout: VDeviceLayout | None = None
        self.vdevices: VDeviceManager | None = None
        self.supervisor: PluginSupervisor | None = None
        self.pods: PodCache | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._poke = asyncio.Event()
        self._published = False
        self.started = False
        self.health: HealthMonitor | None = None
        self.metrics: AgentMetrics | None = None
        self.http: MetricsServer | None = None
        self.mode = mode_of(config)  # device-plugin, dra or both (gpumgr run --mode)
        self.dra: DraFrontEnd | None = None
        self.cordon: CordonWatch | None = None
        self._handing_out: asyncio.Event | None = None  # set once the ledger may be handed out (device plugins)
        self.mig: MigRuntime | None = None  # MIG-capable cards: the manager, layout report, per-profile plugins
        self._mig_supervisors: list[PluginSupervisor] = []  # plugins of profiles a live layout change brought in
        self._mig_live: LiveLayout | None = None  # the MIG layout label, applied while serving
        self._node_labels_seen: dict[str, str] | None = None  # the node's labels at the last cordon read

    @property
    def ready(self) -> bool:
        if not self.started or (self._handing_out is not None and not self._handing_out.is_set()):
            return False
        return self.mode == "dra" or (self.supervisor is not None and self.supervisor.ready)

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        inv = await loop.run_in_executor(None, self.backend.inventory)
        log.info("node %s: %d GPUs (%s), driver %s", cfg.node_name, inv.count,
                 ", ".join(sorted({g.name for g in inv.gpus})), inv.driver_version or "?")
        store = CheckpointStore(cfg.checkpoint_dir)
        state = NodeState(cfg.node_name, inv, store, cfg.memory_unit_mib)
        load_checkpoint(state)
        self.state = state
        await self._start_mig(state)

        self.pods = PodCache(self.kube, cfg.node_name)
        def poke() -> None:
            loop.call_soon_threadsafe(self._poke.set)

        self.pods.start(on_change=poke)
        # /healthz answers from here on (the chart's liveness probe), /readyz once the plugins are registered
        metrics = AgentMetrics()
        self.metrics = metrics
        self.cordon = CordonWatch(inv.gpus)
        reader = UsageReader(state, self.backend, self.pods.get, CgroupReader(cfg.cgroup_root), cordon=self.cordon)
        self.http = await start_http(build_app(metrics, reader, ready=lambda: self.ready),
                                     *parse_addr(cfg.metrics_addr))
        log.info("metrics on %s/metric (also /graph, /usage, /healthz, /readyz)", self.http.url)

        shim_dir = Path(cfg.shim_dir)
        await loop.run_in_executor(None, vdriver.install_shim, Path(cfg.shim_source), shim_dir)
        staged = await loop.run_in_executor(None, vdriver.stage_driver, Path(cfg.driver_root),
                                            vdriver.driver_dir(shim_dir))
        log.info("driver libraries: %d NVIDIA entries from %s staged in %s", staged, cfg.driver_root,
                 vdriver.driver_dir(shim_dir))
        layout = self.layout = VDeviceLayout(cfg.vdevice_root)
        vdevices = self.vdevices = VDeviceManager(layout, cfg.proc_root, on_register=metrics.vdevice_registration)
        self.service = AllocationService(
            state, self.pods, layout, vdevices,
            ServiceConfig(kubelet_checkpoint=cfg.kubelet_checkpoint,
                          response=ResponseConfig(dev_root=cfg.dev_root, driver_dir=str(vdriver.driver_dir(shim_dir)),
                                                  shim_dir=cfg.shim_dir, cdi=cfg.cdi)),
            annotator=self.kube, events=metrics,
        )
        self.service.cordon = self.cordon
        service = self.service
        self.health = HealthMonitor(
            self.backend, state,
            HealthConfig(ignored_xids=frozenset(cfg.health_ignore_xids), temp_unhealthy_c=cfg.temp_unhealthy_c,
                         temp_healthy_c=cfg.temp_healthy_c),
            on_transition=self._on_health, on_xid=self._on_xid)
        if self.mig is not None:
            mig = self.mig
            self.health.on_instance_event = lambda event: mig.on_instance_event(state, event)
        await self.health.start()  # health is known before the plugins first list their devices

        # the plugins register now; their Allocate-side calls wait until the pods are listed and the start-up
        # reconcile is done (only then may the ledger be handed out)
        handing_out = asyncio.Event()
        if self.mode != "dra":
            self.supervisor = PluginSupervisor(cfg.device_plugin_dir, [
                PluginSpec(podspec.RESOURCE_CORE, "vcore.sock",
                           PluginServicer(self.service, "c", podspec.RESOURCE_CORE, ready=handing_out)),
                PluginSpec(podspec.RESOURCE_MEMORY, "vmemory.sock",
                           PluginServicer(self.service, "m", podspec.RESOURCE_MEMORY, ready=handing_out)),
                *(self.mig.build_plugins(state, service) if self.mig is not None else []),
            ], on_register=self._on_register)
            await self.supervisor.start()
        self._handing_out = handing_out
        # the cordon read is bounded: a hung API server must not hold the calls that wait for `handing_out`
        _, synced = await asyncio.gather(self._first_cordon(), self.pods.wait_synced(POD_SYNC_TIMEOUT_S))
        if synced:
            await self._reconcile("start")
            handing_out.set()
        else:
            # Without the node's pods the start-up reconcile cannot restore what the kubelet holds but our
            # checkpoint lacks, so handing out cards now could double-book them: wait for the list.
            log.error("pods on node %s not listed within %.0fs; GPU allocations are refused (UNAVAILABLE) until "
                      "they are listed and the start-up reconcile has run", cfg.node_name, POD_SYNC_TIMEOUT_S)
            self._tasks.append(asyncio.create_task(self._hand_out_once_synced(handing_out)))
        if self.mode != "device-plugin":  # DRA claims come in through the same ledger, vDevice servers and health
            from gpumgr.dra.frontend import start_dra

            self.dra = await start_dra(self)
        self._published = await self.publish_inventory()
        await self.publish_labels()
        for background in (self._reconcile_loop(), self._publish_loop(), self._cordon_loop()):
            self._tasks.append(asyncio.create_task(background))
        if self.mig is not None:  # the node's MIG layout label, applied while serving (read with the cordon)
            from gpumgr.mig.live import LiveLayout

            self._mig_live = LiveLayout(self.mig, state, self._seen_node_labels, self._mig_layout_changed)
        self.started = True

    async def _first_cordon(self) -> None:
        try:
            await asyncio.wait_for(self.refresh_cordon(), CORDON_FIRST_READ_S)
        except TimeoutError:
            log.warning("reading node %s for its GPU cordon took over %.0fs; read again later", self.config.node_name,
                        CORDON_FIRST_READ_S)

    async def _hand_out_once_synced(self, handing_out: asyncio.Event) -> None:
        assert self.service is not None and self.pods is not None
        while not await self.pods.wait_synced(POD_SYNC_TIMEOUT_S):
            log.error("pods on node %s still not listed; GPU allocations stay refused", self.config.node_name)
        await self._reconcile("start")
        handing_out.set()
        log.info("pods on node %s listed and the start-up reconcile done: GPU allocations are served",
                 self.config.node_name)

    async def _reconcile_loop(self) -> None:
        assert self.service is not None and self.pods is not None
        loop = asyncio.get_running_loop()
        next_full = loop.time() + self.config.check_period_s
        while True:
            timeout = max(0.0, next_full - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), timeout)
            periodic = loop.time() >= next_full
            if periodic:
                next_full = loop.time() + self.config.check_period_s
            else:
                await asyncio.sleep(0.1)  # let a burst of pod changes settle
            self._poke.clear()
            try:
                await self._reconcile("periodic" if periodic else "pods changed", full=periodic)
            except Exception:  # noqa: BLE001 - the loop must go on
                log.exception("reconcile failed")

    async def _reconcile(self, why: str, full: bool = True) -> None:
        """The vcuda allocations, then the device plugins' MIG holdings (gpumgr/mig/holdings.py)."""
        assert self.service is not None and self.pods is not None
        # one listing (and at most one fresh API list) for both passes, judging what the ledger held as it began
        pods = RoundPods(self.pods, self.service.state.ledger.allocations)
        await reconcile(self.service, self.pods.synced, self.config.grace_s, why, full=full, round_pods=pods)
        if self.mig is not None and self.mode != "dra":
            from gpumgr.mig.holdings import reconcile_holdings

            await reconcile_holdings(self.service, self.mig.served(self.service.state), self.config.grace_s, why,
                                     full=full, round_pods=pods)

    async def publish_inventory(self) -> bool:
        """The node annotation the extender reads: cards, links and which cards are unhealthy."""
        assert self.state is not None
        st = self.state
        unhealthy = {i for i in st.health_reasons if not st.healthy(i)}
        unhealthy |= {c.index for c in st.ledger.cards if c.mig}  # MIG mode: the extender places no vcuda pod there
        mig = None
        if self.mig is not None:  # MIG cards' profiles, placements and instances, for the extender
            from gpumgr.mig.published import node_mig

            mig = node_mig(self.mig.cards, st.ledger, self.config.mig_prefix)
        text = node_inventory.encode(st.inventory, unhealthy, st.memory_unit_mib, mig)
        try:
            await self.kube.patch_node_metadata(self.config.node_name,
                                                annotations={podspec.ANN_NODE_INVENTORY: text})
        except Exception as e:  # noqa: BLE001 - retried by the publish loop
            log.warning("publishing the GPU inventory on node %s failed: %s", self.config.node_name, e)
            return False
        return True

    async def publish_labels(self) -> None:
        """Model, count, memory, driver labels on the node: patched only when they differ (no churn)."""
        cfg = self.config
        assert self.state is not None
        try:
            node = await self.kube.get_node(cfg.node_name)
            current = ((node or {}).get("metadata") or {}).get("labels") or {}
            wanted = node_labels(self.state.inventory, cfg.label_prefix)
            also: set[str] = {GAIA_MODEL_LABEL}
            if self.mig is not None:  # GPU Feature Discovery's MIG labels (gpumgr/mig/labels.py)
                from gpumgr.mig.labels import mig_labels, owned

                wanted.update(mig_labels(self.mig.cards, self.state.ledger, self.mig.layout_refused,
                                         self.mig.settings.shared))
                also |= owned(current, wanted)
            patch = labels_patch(current, wanted, cfg.label_prefix, also)
            if patch:
                await self.kube.patch_node_metadata(cfg.node_name, labels=patch)
                log.info("node %s labels updated: %s", cfg.node_name, patch)
        except Exception as e:  # noqa: BLE001 - labels are retried at the next start
            log.warning("labelling node %s failed: %s", cfg.node_name, e)

    async def refresh_cordon(self) -> None:
        """Read the node's gpumgr.io/cordoned-gpus (cards that take no new pods). An API error keeps the last."""
        if self.cordon is None:
            return
        try:
            node = await self.kube.get_node(self.config.node_name)
        except Exception as e:  # noqa: BLE001 - retried at the next refresh
            log.warning("reading node %s for its GPU cordon failed: %s", self.config.node_name, e)
            return
        if node is not None:
            self._node_labels_seen = dict(((node.get("metadata") or {}).get("labels")) or {})
        if node is not None and self.cordon.update(node):
            c = self.cordon.current
            if c.error:
                log.error("node %s: %s; every card is treated as cordoned until it is fixed", self.config.node_name,
                          c.error)
            else:
                log.info("node %s: cordoned cards now %s", self.config.node_name, sorted(c.cards) or "none")

    async def _cordon_loop(self) -> None:
        """The node read every CORDON_REFRESH_S: its GPU cordon, and its MIG layout label (gpumgr/mig/live.py: no
        read of its own, so a MIG node costs the API server no more requests)."""
        while True:
            await asyncio.sleep(CORDON_REFRESH_S)
            self._node_labels_seen = None
            await self.refresh_cordon()
            if self._mig_live is not None:
                try:
                    await self._mig_live.check()
                except Exception:  # noqa: BLE001 - the loop must go on
                    log.exception("MIG: applying a changed layout failed; tried again at the next read")

    async def _seen_node_labels(self) -> dict[str, str] | None:
        return self._node_labels_seen

    async def _start_mig(self, state: NodeState) -> None:
        """MIG before any front end serves: reconcile with NVML, apply the layout, the per-profile plugins."""
        from gpumgr.mig import agent as mig_agent

        cfg = self.config

        async def labels() -> dict[str, str]:  # read only when a card is MIG-capable
            return dict(await self._node_labels() or {})  # (unreadable: the configured layout is used instead)

        settings = mig_agent.MigSettings(layout=cfg.mig_layout, layouts_file=cfg.mig_layouts_file,
                                         prefix=cfg.mig_prefix, mig_minors=cfg.mig_minors, cdi=cfg.cdi,
                                         shared=dict(cfg.mig_shared))
        self.mig = await mig_agent.start(state, self.backend, settings, labels)

    async def _node_labels(self) -> dict[str, str] | None:
        """The node's labels (for its MIG layout label at start), or None when the node cannot be read."""
        from gpumgr.mig.agent import LABEL_READ_S

        try:
            node = await asyncio.wait_for(self.kube.get_node(self.config.node_name), LABEL_READ_S)
            return dict(((node or {}).get("metadata") or {}).get("labels") or {})
        except Exception as e:  # noqa: BLE001 - the configured layout is used instead
            log.warning("reading node %s for its MIG layout label failed: %s", self.config.node_name, e)
            return None

    async def _mig_layout_changed(self, report: Any) -> None:
        """A live layout change was applied (gpumgr/mig/live.py): plugins of new profiles, labels."""
        assert self.state is not None and self.mig is not None
        if self.mode != "dra" and self.service is not None:
            new = self.mig.build_plugins(self.state, self.service)
            if new:
                sup = PluginSupervisor(self.config.device_plugin_dir, new, on_register=self._on_register)
                await sup.start()
                self._mig_supervisors.append(sup)
        if self.dra is not None:  # the DRA pool follows the cards' MIG modes (and the ledger's slots by itself)
            self.dra.publisher.mig_cards = self.mig.cards
        await self.publish_labels()

    def _on_register(self, resource: str, again: bool) -> None:
        if again and self.metrics is not None:
            self.metrics.reregistration(resource)

    def _on_health(self, index: int, healthy: bool, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.health_transition(index, healthy, reason)

    def _on_xid(self, index: int, xid: int) -> None:
        if self.metrics is not None:
            self.metrics.xid_error(index, xid)

    async def _publish_loop(self) -> None:
        assert self.state is not None
        st = self.state
        seen = self._published_state() if self._published else None
        version = st.version
        while True:
            version = await st.wait_change(version, timeout=5 if seen is None else 30)
            now = self._published_state()
            if now == seen:
                continue
            if await self.publish_inventory():  # retried every few seconds until the API takes it
                seen = now

    def _published_state(self) -> tuple[object, ...]:
        """What the inventory annotation depends on beyond the static inventory: health and the MIG slots."""
        assert self.state is not None
        st = self.state
        return (tuple(st.healthy(g.index) for g in st.inventory.gpus),
                tuple(sorted((s.card, s.start, s.profile, s.origin) for s in st.ledger.slots.values())))

    async def stop(self) -> None:
        if self.health is not None:
            await self.health.stop()
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.supervisor:
            await self.supervisor.stop()
        for sup in self._mig_supervisors:
            await sup.stop()
        if self.dra is not None:
            await self.dra.stop()
        if self.service:
            await self.service.drain()
            await self.service.vdevices.stop_all()
        if self.http is not None:
            await self.http.close()
        if self.state is not None:
            self.state.close()
        if self.pods:
            self.pods.stop()
