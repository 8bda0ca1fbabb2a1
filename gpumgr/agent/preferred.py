"""The device lists of ListAndWatch and GetPreferredAllocation: which IDs the kubelet should pick, so that the
cards it chooses fit every pending pod it could be admitting (see guess.py).
"""

from __future__ import annotations

from gpumgr.agent import guess
from gpumgr.agent.errors import PluginError
from gpumgr.agent.settle import Settling
from gpumgr.allocator import InvalidRequest, NoFit, Request, choose
from gpumgr.deviceplugin import ids as devids
from gpumgr.pb import deviceplugin_pb2 as pb


class Preferring(Settling):
    # -- ListAndWatch ---------------------------------------------------------------------------------------
    def devices(self, kind: str) -> list[pb.Device]:
        table = self._core_ids if kind == "c" else self._mem_ids
        out = []
        for g in self.state.inventory.gpus:
            health = "Healthy" if self.state.healthy(g.index) else "Unhealthy"
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=g.numa_node)]) if g.numa_node is not None else None
            for d in table[g.index]:
                out.append(pb.Device(ID=d, health=health, topology=topo))
        return out

    # -- GetPreferredAllocation -----------------------------------------------------------------------------
    async def preferred(self, kind: str, req: pb.ContainerPreferredAllocationRequest) -> list[str]:
        inv = self.state.inventory
        size = int(req.allocation_size)
        if size <= 0:
            raise PluginError.invalid(f"allocation_size must be positive, got {size}")
        available = list(req.available_deviceIDs)
        must = list(req.must_include_deviceIDs)
        try:
            per_card = self._group(available, kind)
            must_cards = sorted(devids.cards_of(inv, must, kind))
        except devids.BadDeviceID as e:
            raise PluginError.invalid(str(e)) from None
        self._check_advertised(must, kind)
        cards = await self._planned_cards(kind, size)
        if must_cards:  # devices reused from an init container: stay on their card(s) first
            cards = tuple(must_cards) + tuple(c for c in (cards or ()) if c not in must_cards)
        chosen = list(must)
        taken = set(chosen)
        if cards is not None:
            need = size - len(chosen)
            pool = [d for c in cards for d in per_card.get(c, []) if d not in taken]
            if kind == "c" and size >= 100 and len(pool) < need:
                pool = []  # whole cards or nothing
            chosen += pool[:need]
            taken.update(pool[:need])
        if len(chosen) < size:  # the kubelet's view differs from ours: fill from what it offers
            rest = [d for d in sorted(available) if d not in taken]
            chosen += rest[: size - len(chosen)]
        return chosen[:size]

    def _group(self, device_ids: list[str], kind: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        advertised = self._advertised[kind]
        for d in device_ids:
            index = advertised.get(d)
            if index is None:
                raise devids.BadDeviceID(f"{d!r} is not a device of this plugin on this node")
            out.setdefault(index, []).append(d)
        return out

    async def _planned_cards(self, kind: str, size: int) -> tuple[int, ...] | None:
        """Cards on which every pending pod the kubelet could be admitting fits (see guess.py)."""
        if kind == "c":
            ckpt = await self._kubelet_checkpoint_or_none()
            await self._settle(ckpt)
            ledger = self.state.ledger  # after settling (a commit replaces the ledger)
            cands = await self._visible_candidates(size, ckpt)
            cordon = self.cordon()
            if not cands:
                try:
                    return choose(self.state.topology, ledger,
                                  Request(size, self.state.memory_unit_mib if size < 100 else 0),
                                  frozenset(range(len(ledger))) - cordon.cards if cordon.cards else None).cards
                except (InvalidRequest, NoFit):
                    return None
            planned = guess.plan(self.state.topology, ledger, cands, self.state.memory_unit_mib,
                                 self.state.inventory.gpus, cordon)
            if planned.cards is None or len(planned.possible) < len(cands):
                dead = await self._dead_holders(self._holders_on(None, skip=[]), ckpt)
                if dead:  # gone pods' holdings, freed when the kubelet hands out their devices: plan without them
                    planned = guess.plan(self.state.topology, self._without(dead), cands, self.state.memory_unit_mib,
                                         self.state.inventory.gpus, cordon)
            return planned.cards
        # vcuda-memory: the card of the container's vcuda-core allocation, when it was made first
        for a in reversed(list(self.state.ledger.allocations.values())):
            h = a.container_holder
            if not a.verified and a.cores < 100 and h is not None and h.memory_units == size:
                return a.cards
        return None
