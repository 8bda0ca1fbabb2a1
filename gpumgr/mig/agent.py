"""MIG in `gpumgr run`: at start, after the checkpoint is loaded and before any front end serves, reconcile the
ledger with NVML, apply the static layout (the node label `nvidia.com/mig.config`, else `--mig-layout`), and build
one device plugin per profile that has instances (`<prefix><profile>`). Instance health: an event that names a GI
marks that instance only (the card's other instances and its whole-card health stay as they are)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumgr.deviceplugin import mig as plugin
from gpumgr.deviceplugin import mig_shared as shared
from gpumgr.deviceplugin.supervisor import PluginSpec
from gpumgr.devices.types import HealthEvent
from gpumgr.files.docfile import InputError, load_doc
from gpumgr.mig import layout as lay
from gpumgr.mig import node as mig_node
from gpumgr.mig.apply import apply_layout
from gpumgr.mig.manager import MigManager
from gpumgr.mig.types import MigCard
from gpumgr.node.state import NodeState

if TYPE_CHECKING:
    from gpumgr.agent.base import ServiceBase

log = logging.getLogger("gpumgr.mig")
LABEL_READ_S = 5.0
_MAX_SHARED = 64  # profiles in --mig-shared (NVIDIA cards have fewer than 20)


@dataclass(frozen=True)
class MigSettings:
    layout: str = ""  # a layout name; empty: none (instances are left as they are, and served)
    layouts_file: str = ""  # JSON {name: {"all" | "<card>": [profile, ...]}}
    prefix: str = plugin.DEFAULT_PREFIX
    mig_minors: Path = plugin.MigPluginConfig().mig_minors
    cdi: bool = False
    shared: Mapping[str, int] = field(default_factory=dict)  # profile -> replicas (`<prefix><profile>.shared`)


@dataclass
class MigRuntime:
    manager: MigManager
    health: plugin.MigHealth
    report: lay.Report
    plugins: list[PluginSpec] = field(default_factory=list)
    cards: tuple[MigCard, ...] = ()  # after the layout: modes, profiles, instances
    layout_refused: bool | None = None  # None: no layout asked
    settings: MigSettings = field(default_factory=MigSettings)
    layout_name: str | None = None  # the layout last applied (or asked and refused)

    def served(self, state: NodeState) -> dict[str, str]:
        """{resource: profile} of the device plugins the layout's instances need (shared profiles as `.shared`)."""
        out = {}
        for p in sorted({s.profile for s in state.ledger.slots.values() if s.origin != "claim"}):
            name = plugin.resource_name(p, self.settings.prefix)
            out[name + shared.SUFFIX if p in self.settings.shared else name] = p
        return out

    def build_plugins(self, state: NodeState, service: ServiceBase) -> list[PluginSpec]:
        """The device plugins of the profiles with instances not served yet (all of them at start; those a live
        layout change brings in later); a shared profile's serves its replicas (mig_shared.py). A plugin whose
        instances are all gone stays, listing no device: the kubelet then counts 0 of its resource."""
        cfg = plugin.MigPluginConfig(mig_minors=self.settings.mig_minors, cdi=self.settings.cdi)
        have = {p.resource for p in self.plugins}
        new: list[PluginSpec] = []
        for resource, p in self.served(state).items():
            if resource in have:
                continue
            replicas = self.settings.shared.get(p)
            if replicas:
                servicer: plugin.MigPluginServicer = shared.MigSharedServicer(service, p, resource, replicas,
                                                                              self.health, cfg)
                new.append(PluginSpec(resource, shared.shared_socket(p), servicer))
            else:
                new.append(PluginSpec(resource, plugin.socket_name(p),
                                      plugin.MigPluginServicer(state, p, resource, self.health, cfg)))
        self.plugins += new
        if new:
            log.info("MIG: device plugins for %s", ", ".join(p.resource for p in new))
        return new

    def on_instance_event(self, state: NodeState, event: HealthEvent) -> bool:
        """True when the event named one of the ledger's instances (marked; the card is left alone)."""
        if event.gi is None:
            return False
        marked = plugin.mark(self.health, state.ledger, event.index, event.gi, f"{event.kind} {event.code}")
        if marked:
            log.warning("MIG instance %s unhealthy: %s %d (the card's other instances are not)", marked,
                        event.kind.upper(), event.code)
        return marked is not None


def load_layouts(path: str) -> dict[str, Any]:
    """The configured layouts file (JSON, or YAML), bounded in size and depth by gpumgr/files/docfile.py; ValueError
    naming the file and line."""
    if not path:
        return {}
    try:
        doc = load_doc(path)
    except InputError as e:
        raise ValueError(f"--mig-layouts-file {e}") from None
    if not isinstance(doc.data, dict):
        raise ValueError(f"--mig-layouts-file {path}:1: must be an object of named layouts")
    for name in doc.data:
        try:
            lay.parse(str(name), doc.data)
        except lay.LayoutError as e:
            raise ValueError(f"--mig-layouts-file {path}:{doc.line((name,))}: {e}") from None
    return dict(doc.data)


def parse_shared(text: str) -> dict[str, int]:
    """`--mig-shared 1g.10gb=4,2g.20gb=2` -> {profile: replicas}; ValueError naming what is wrong."""
    out: dict[str, int] = {}
    items = [x.strip() for x in text.split(",") if x.strip()]
    if len(items) > _MAX_SHARED:
        raise ValueError(f"--mig-shared: at most {_MAX_SHARED} profiles, got {len(items)}")
    for item in items:
        name, eq, n = item.partition("=")
        name = name.strip()
        if not eq or not re.fullmatch(r"[1-8]g\.[0-9]{1,3}gb(\+me)?", name) or not n.strip().isdigit() \
                or not 2 <= int(n) <= shared.MAX_REPLICAS:
            raise ValueError(f"--mig-shared: {item[:60]!r} is not <profile>=<replicas 2..{shared.MAX_REPLICAS}> "
                             "(e.g. 1g.10gb=4)")
        if name in out:
            raise ValueError(f"--mig-shared: profile {name} given twice")
        out[name] = int(n)
    return out


async def start(state: NodeState, backend: Any, settings: MigSettings,
                node_labels: Callable[[], Awaitable[Mapping[str, str]]]) -> MigRuntime | None:
    """None when no card is MIG-capable (or the backend knows no MIG). The device plugins are built once the
    device-plugin service exists (`MigRuntime.build_plugins`)."""
    if not hasattr(backend, "mig_cards"):
        return None
    cards = await asyncio.to_thread(backend.mig_cards)
    if not cards:
        return None
    layout = None
    name = lay.chosen(await node_labels(), settings.layout or None)
    if name:
        try:
            layout = lay.parse(name, await asyncio.to_thread(load_layouts, settings.layouts_file))
        except (lay.LayoutError, ValueError) as e:
            log.error("MIG layout not applied: %s", e)
    manager, plan = await mig_node.start(state, backend, layout)
    report = lay.Report()
    if layout is not None:
        report = await asyncio.to_thread(apply_layout, manager, lambda: state.ledger, layout)
    runtime = MigRuntime(manager=manager, health=plugin.MigHealth(), report=report,
                         cards=await asyncio.to_thread(manager.cards),
                         layout_refused=None if not name else layout is None or bool(report.refused),
                         settings=settings, layout_name=name)
    log.info("MIG: %d capable cards, %d instances", len(cards), len(state.ledger.slots))
    return runtime
