"""Live layout changes: while serving, the agent reads its Node's `nvidia.com/mig.config` label (else
`--mig-layout`) with the node read it makes anyway (the cordon's, every 15 s) and applies a changed layout to the
cards nothing holds, through the same crash-safe steps as at start (gpumgr/mig/apply.py). Cards something holds are
refused with the reason (the log, and `nvidia.com/mig.config.state=failed`); a layout with refusals is tried again
once the ledger changed (`NodeState.version`: a holder went, an instance was made or destroyed, a card's health),
so a card is changed once its holders are gone (the state label then turns `success`), and every RETRY_READS-th
read even when it did not (an Ampere card reset meanwhile shows in NVML, not in the ledger); the reads between cost
no NVML call and no file read. After a
change `on_change` runs: the daemon starts the device plugins of new profiles (those of profiles that are gone stay,
listing no device, so the kubelet counts 0 of them) and publishes the labels; the inventory annotation follows the
ledger's slots by itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from gpumgr.mig import layout as lay
from gpumgr.mig.agent import MigRuntime, load_layouts
from gpumgr.mig.apply import apply_layout
from gpumgr.node.state import NodeState

log = logging.getLogger("gpumgr.mig")
RETRY_READS = 20  # a refused layout, the ledger unchanged: tried again every 20th node read (5 min at 15 s)


@dataclass
class LiveLayout:
    runtime: MigRuntime
    state: NodeState
    labels: Callable[[], Awaitable[Mapping[str, str] | None]]  # the Node's labels; None: could not be read
    on_change: Callable[[lay.Report], Awaitable[None]]
    last_refused: tuple[str, ...] = field(default=())
    tried_at: int | None = None  # the ledger version before the last try of runtime.layout_name, when refused
    skipped: int = 0  # reads since then that tried nothing

    def __post_init__(self) -> None:
        self.last_refused = tuple(self.runtime.report.refused)
        if self.runtime.layout_refused and self.runtime.layout_name:
            self.tried_at = self.state.version

    async def check(self) -> bool:
        """Apply the layout the node asks for when it changed (or was refused before); True when anything the
        node publishes changed."""
        labels = await self.labels()
        if labels is None:
            return False
        rt = self.runtime
        name = lay.chosen(labels, rt.settings.layout or None)
        if name is None:  # no layout asked any more: the instances are kept as they are
            return False
        retry = name == rt.layout_name
        if retry and not rt.layout_refused:
            return False
        if retry and self.tried_at == self.state.version and self.skipped + 1 < RETRY_READS:
            self.skipped += 1  # nothing a refusal depends on changed: trying again would refuse the same
            return False
        self.skipped = 0
        version = self.state.version  # before the try: a holder that goes while it runs is a change still to see
        try:
            layout = lay.parse(name, await asyncio.to_thread(load_layouts, rt.settings.layouts_file))
        except (lay.LayoutError, ValueError) as e:
            if retry:
                self.tried_at = version
                return False
            log.error("MIG: node label %s asks layout %s: not applied: %s", lay.LABEL, name, e)
            rt.layout_name, rt.layout_refused, rt.report = name, True, lay.Report(refused=[str(e)])
            self.tried_at = version
            await self.on_change(rt.report)
            return True
        if not retry:
            log.info("MIG: layout %s asked (was %s): applying it to the cards nothing holds", name,
                     rt.layout_name or "none")
        before = self._slots()
        report = await asyncio.to_thread(apply_layout, rt.manager, lambda: self.state.ledger, layout, retry)
        refused = tuple(report.refused)
        if retry and refused != self.last_refused:
            for line in refused:
                log.warning("MIG refused: %s", line)
        if retry and not refused:
            log.info("MIG: layout %s is now applied to every card", name)
        changed = not retry or refused != self.last_refused or self._slots() != before
        rt.layout_name, rt.layout_refused, rt.report = name, bool(refused), report
        self.last_refused = refused
        self.tried_at = version if refused else None  # its own changes (other cards) cost one more try
        if changed:
            rt.cards = await asyncio.to_thread(rt.manager.cards)
            await self.on_change(report)
        return changed

    def _slots(self) -> frozenset[tuple[str, str, str]]:
        return frozenset((s.name, s.profile, s.uuid) for s in self.state.ledger.slots.values())
