"""Publishes the node's pool as ResourceSlices: updated in place (never recreated), generation bumped on every
change, only this driver's slices on this node touched, all deleted when the node has no GPUs.

In `both` mode the capacity shown leaves out what device-plugin pods hold (ledger entries not under `dra/`), so
the scheduler cannot double-book a card the gpu-manager pods use; the slice follows those changes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Any

from gpumgr.dra.config import DraConfig
from gpumgr.dra.kubeaccess import DraKube
from gpumgr.dra.mig_slices import MigPart, assemble, mig_part
from gpumgr.dra.slices import build_spec, unhealthy_map
from gpumgr.mig.types import MigCard
from gpumgr.node.claims import LEDGER_PREFIX
from gpumgr.node.state import NodeState

log = logging.getLogger("gpumgr.dra.slices")
RETRY_S = 1.0
PERIOD_S = 60.0  # re-check the API now and then: someone may have deleted or edited the slice


class SlicePublisher:
    def __init__(self, cfg: DraConfig, state: NodeState, kube: DraKube):
        self.cfg = cfg
        self.state = state
        self.kube = kube
        self.published: Any = None  # the spec (a list of them with MIG) last written, without generation
        self.mig_cards: tuple[MigCard, ...] = ()  # MIG-capable cards: partitionable devices (dra/mig_slices.py)
        self.publishes = 0
        # the MIG counter sets and devices, kept with what they were built from (the MIG cards, the static layout's
        # instances, the cards' health): built again when that changed, not at every claim or share of a card
        self._mig: tuple[Any, MigPart] | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @property
    def slice_name(self) -> str:
        return f"{self.cfg.node_name}-{self.cfg.driver_name}"[:253]

    def wanted(self, generation: int) -> dict[str, Any]:
        st = self.state
        held: dict[int, tuple[int, int]] = {}
        for card in st.ledger.cards:
            others = [h for k, h in card.holders.items() if not k.startswith(LEDGER_PREFIX)]
            if others:
                held[card.index] = (sum(h.cores for h in others), sum(h.memory_mib for h in others))
        return build_spec(st.inventory, self.cfg.node_name, self.cfg.driver_name, unhealthy_map(st.health_reasons),
                          self.cfg.memory_unit_mib, generation, held)

    def wanted_all(self, generation: int) -> list[dict[str, Any]]:
        """The pool's slices: one, or with MIG cards in MIG mode counter slices and device slices (mig_slices)."""
        base = self.wanted(generation)
        mig = [c for c in self.mig_cards if c.enabled]
        if not mig:
            return [base]
        unhealthy = unhealthy_map(self.state.health_reasons)
        taken = sorted((s.card, s.start, s.size) for s in self.state.ledger.slots.values() if s.origin != "claim")
        key = (self.mig_cards, taken, sorted((i, r) for i, r in unhealthy.items() if any(c.index == i for c in mig)))
        if self._mig is None or self._mig[0] != key:
            self._mig = key, mig_part(self._free(mig, taken), self.state.inventory, unhealthy,
                                      self.cfg.memory_unit_mib)
        return assemble(base, self._mig[1])

    @staticmethod
    def _free(mig: list[MigCard], taken: list[tuple[int, int, int]]) -> list[MigCard]:
        """The cards with the placements the static layout's instances overlap left out (not for claims)."""
        return [replace(c, profiles=tuple(replace(p, starts=tuple(
            st for st in p.starts if not any(card == c.index and st < start + size and start < st + p.memory_slices
                                             for card, start, size in taken))) for p in c.profiles))
                for c in mig]

    def slice_names(self, count: int) -> list[str]:
        return [self.slice_name] + [f"{self.slice_name[:240]}-{k}" for k in range(1, count)]

    async def publish(self) -> bool:
        """Make the API show the current pool. True when it does (changed or not)."""
        if any(c.enabled for c in self.mig_cards):
            return await self._publish_many()
        try:
            existing = await self.kube.list_slices(self.cfg.driver_name, self.cfg.node_name)
            mine = [s for s in existing if (s.get("spec") or {}).get("driver") == self.cfg.driver_name
                    and (s.get("spec") or {}).get("nodeName") == self.cfg.node_name]
            if not self.state.inventory.gpus:
                for s in mine:
                    await self.kube.delete_slice(s["metadata"]["name"])
                self.published = None
                return True
            current = next((s for s in mine if s["metadata"]["name"] == self.slice_name), None)
            for s in mine:  # slices of ours under other names (an older agent's): the pool is one slice now
                if s is not current:
                    await self.kube.delete_slice(s["metadata"]["name"])
            if current is None:
                # ours by name but no longer this node's or this driver's (its spec edited by someone else)?
                current = await self.kube.get_slice(self.slice_name)
                if current is not None:
                    log.warning("ResourceSlice %s was changed by someone else to driver %r, node %r: putting "
                                "this node's pool back in it", self.slice_name,
                                str((current.get("spec") or {}).get("driver"))[:63],
                                str((current.get("spec") or {}).get("nodeName"))[:253])
                elif self.published is not None:
                    log.warning("ResourceSlice %s was deleted by someone else: publishing it again",
                                self.slice_name)
            if current is None:
                spec = self.wanted(1)
                await self.kube.create_slice({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                              "metadata": {"name": self.slice_name}, "spec": spec})
                log.info("ResourceSlice %s created: %d devices", self.slice_name, len(spec["devices"]))
            else:
                old_spec = current.get("spec") or {}
                generation = _generation(old_spec)
                spec = self.wanted(generation + 1)
                if _same(old_spec, spec):
                    self.published = _strip(spec)  # what the API shows, not what the node shows by now
                    return True
                if self.published is not None and _strip(old_spec) != self.published:
                    log.warning("ResourceSlice %s was edited by someone else (it is not what this agent wrote): "
                                "putting it back", self.slice_name)
                body = dict(current, spec=spec)
                await self.kube.replace_slice(self.slice_name, body)
                log.info("ResourceSlice %s updated: pool generation %d", self.slice_name, generation + 1)
            self.publishes += 1
            self.published = _strip(spec)
            return True
        except Exception as e:  # noqa: BLE001 - retried by the loop
            log.warning("publishing ResourceSlice %s failed: %s", self.slice_name, e)
            return False

    async def _publish_many(self) -> bool:
        """The pool as several slices (counters apart from devices): all carry one generation, bumped when any
        changes; slices of ours under other names are deleted."""
        try:
            existing = await self.kube.list_slices(self.cfg.driver_name, self.cfg.node_name)
            mine = {s["metadata"]["name"]: s for s in existing
                    if (s.get("spec") or {}).get("driver") == self.cfg.driver_name
                    and (s.get("spec") or {}).get("nodeName") == self.cfg.node_name}
            generation = max((_generation(s.get("spec") or {}) for s in mine.values()), default=0)
            specs = self.wanted_all(generation)
            names = self.slice_names(len(specs))
            same = set(mine) == set(names) and all(_same(mine[n]["spec"], s) for n, s in zip(names, specs,
                                                                                              strict=True))
            if not same:
                specs = self.wanted_all(generation + 1)
                for n, spec in zip(names, specs, strict=True):
                    if n in mine:
                        await self.kube.replace_slice(n, dict(mine[n], spec=spec))
                    else:
                        await self.kube.create_slice({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                                      "metadata": {"name": n}, "spec": spec})
                for n in set(mine) - set(names):
                    await self.kube.delete_slice(n)
                log.info("ResourceSlices %s: pool generation %d, %d slices (MIG counters and devices)",
                         self.slice_name, generation + 1, len(specs))
                self.publishes += 1
            self.published = [_strip(s) for s in specs]
            return True
        except Exception as e:  # noqa: BLE001 - retried by the loop
            log.warning("publishing ResourceSlices %s failed: %s", self.slice_name, e)
            return False

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def poke(self) -> None:
        self._changed.set()

    async def _loop(self) -> None:
        version = self.state.version
        ok = await self.publish()
        loop = asyncio.get_running_loop()
        next_full = loop.time() + PERIOD_S
        while True:
            waiter = asyncio.ensure_future(self.state.wait_change(version, timeout=RETRY_S if not ok else PERIOD_S))
            poked = asyncio.ensure_future(self._changed.wait())
            try:
                done, _ = await asyncio.wait({waiter, poked}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in (waiter, poked):
                    if not p.done():
                        p.cancel()
            self._changed.clear()
            if waiter in done:
                version = waiter.result()
            periodic = loop.time() >= next_full
            now = [_strip(s) for s in self.wanted_all(0)] if any(c.enabled for c in self.mig_cards) \
                else _strip(self.wanted(0))
            if ok and not periodic and self.published == now and poked not in done:
                continue  # an allocation change: the slice shows full capacity, nothing to publish
            if periodic:
                next_full = loop.time() + PERIOD_S
            ok = await self.publish()

    async def stop(self, delete: bool = False) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if delete:
            for name in self.slice_names(len(self.wanted_all(0))):
                with contextlib.suppress(Exception):
                    await self.kube.delete_slice(name)


def _generation(spec: dict[str, Any]) -> int:
    """The pool's generation, 0 when someone wrote something that is not a whole number there."""
    value = (spec.get("pool") or {}).get("generation") if isinstance(spec.get("pool"), dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62 else 0


def _strip(spec: dict[str, Any]) -> dict[str, Any]:
    out = dict(spec)
    out["pool"] = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _strip(a) == _strip(b)
