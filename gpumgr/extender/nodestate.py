"""One node as the extender sees it: its GPUs (shape) and the ledger of what pods hold.

A node's *shape* (topology, card models and memory, memory unit, minor numbers) is static and shared by all
nodes with the same hardware, so a 5,000-node cluster of a few machine types builds only a few topologies.
Holdings are kept per pod UID; a holding that conflicts with another (two pods naming one whole card) waits
until the cards are released, so the ledger never over-commits and no holding is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gpumgr.allocator import HUNDRED, Allocation, CardState, Ledger, LedgerError
from gpumgr.allocator.ledger import CLAIM_PREFIX
from gpumgr.devices.types import GPU
from gpumgr.extender.claims import Claim
from gpumgr.node.inventory import NodeGPUs
from gpumgr.node.mig_inventory import NodeMig
from gpumgr.requests.choices import NO_CORDON, Cordon
from gpumgr.topology.cost import Topology

log = logging.getLogger(__name__)

Taken = tuple[int, str, int, int]  # a DRA claim's MIG device: (card, profile, start, size)



class NodeState:
    def __init__(self, name: str, shape: Shape | None, unhealthy: frozenset[int] = frozenset(),
                 problem: str = "", on_change: Callable[[str], None] | None = None):
        self.name = name
        self.shape = shape
        self.problem = problem or ("" if shape else "the node has no GPU inventory")
        self.ledger = Ledger(shape.memory_mib if shape else ())
        self.unhealthy = unhealthy  # as the agent published it (a card in MIG mode is among them)
        for i in unhealthy:
            if 0 <= i < len(self.ledger):
                self.ledger.set_healthy(i, False)
        self.mig: NodeMig | None = None  # the MIG cards the agent published
        self.mig_taken: dict[str, tuple[Taken, ...]] = {}  # DRA claim UID -> the MIG devices it holds here
        self.keys: dict[str, tuple[str, ...]] = {}  # pod UID -> ledger allocation keys it holds
        self.waiting: dict[str, list[Allocation]] = {}  # pod UID -> holdings that conflict with others
        self.on_change = on_change  # told the node's name whenever its ledger changes
        self._state: object = None
        # the ledger's cards as plain values, brought up to date card by card (`refresh`) after holdings change:
        # the hot loops of filter and prioritize read these instead of the ledger's derived properties (sums over
        # holders). Refreshed on demand, not at each change: the initial list of pods changes nodes ~8 times each.
        self.rows: list[CardRow] = []
        self.whole: tuple[tuple[bool, bool], ...] = ()  # per card (healthy, free): the state whole-card asks see
        self.whole_key = 0  # the same as bits: cheap to hash
        self.shared: tuple[CardRow, ...] = ()  # healthy shared cards by (free cores, free memory, index)
        self.used_total = 0  # sum over all cards of used cores (at most 100 each)
        self._touched: set[int] | None = None  # cards whose rows are out of date (None: all of them)
        self.stale = True
        self.gpus: tuple[GPU, ...] = ()  # for per-pod UUID choices and the cordon
        self.cordon: Cordon = NO_CORDON  # the node's gpumgr.io/cordoned-gpus, read

    # -- holdings -------------------------------------------------------------------------------------------
    def allocations(self, uid: str, claim: Claim) -> list[Allocation]:
        """The claim's cards as ledger allocations (minors translated to indices); unknown minors are skipped."""
        if self.shape is None:
            return []
        out = []
        for h in claim.held:
            cards = tuple(self.shape.index_of_minor.get(m, -1) for m in h.minors)
            if -1 in cards:
                log.warning("pod %s container %d: predicate minors %s are not all on node %s (minors %s); ignored",
                            uid, h.index, list(h.minors), self.name, sorted(self.shape.index_of_minor))
                continue
            wanted = h.cores // 100 if h.cores >= 100 else 1
            if len(cards) != wanted or len(set(cards)) != len(cards):
                log.warning("pod %s container %d: %d cores cannot be on cards %s (minors %s); ignored",
                            uid, h.index, h.cores, list(cards), list(h.minors))
                continue
            out.append(Allocation(key=f"{uid}/{h.index}", cards=cards, cores=h.cores,
                                  memory_mib=h.memory_units * self.shape.unit_mib))
        return out

    def hold(self, uid: str, allocs: list[Allocation]) -> None:
        """Record what `uid` holds here, replacing what it held before. Who is counted when holdings conflict does
        not depend on the order the extender learnt of them:
        - a holder keeps its place: its new holdings are counted before any waiting holding is given the room its
          old ones leave, and a waiting holder that still does not fit keeps its turn;
        - a pod goes before a DRA claim (`dra/<uid>`): a pod the node refused fails and drops out, a claim the node
          refused stays allocated in the API, so where both name the same room the pod is the one the node runs."""
        held = self.keys.get(uid)
        if held is not None and [self.ledger.allocations[k] for k in held] == allocs:
            return  # unchanged (most pod updates): nothing to do, and it keeps its place
        touched = self._release(uid)
        freed = bool(touched)  # room that waiting holders may now take
        displaced: set[int] | None = None
        if not allocs:
            self.waiting.pop(uid, None)
        elif self._assign(uid, allocs) or (not uid.startswith(CLAIM_PREFIX)
                                           and (displaced := self._displace_claims(uid, allocs)) is not None):
            self.waiting.pop(uid, None)
            touched.update(i for a in allocs for i in a.cards)
            touched.update(displaced or ())  # a displaced claim's other cards changed too
            freed = freed or bool(displaced)
        else:
            if uid not in self.waiting:
                log.warning("node %s: cards of %s conflict with other holdings; counted once they are free",
                            self.name, uid)
            self.waiting[uid] = allocs  # (an update of a waiting holder keeps its place in the queue)
        if freed:
            touched.update(self._admit_waiting())
        if touched:
            self.changed(touched)

    def take_mig(self, uid: str, taken: tuple[Taken, ...]) -> None:
        """The MIG devices DRA claim `uid` holds here (none: forgets it). A card holding one takes no whole-card
        or fractional request: it is in MIG mode, or soon will be, even before the agent says so."""
        if taken:
            self.mig_taken[uid] = taken
        elif self.mig_taken.pop(uid, None) is None:
            return
        claimed = {t[0] for held in self.mig_taken.values() for t in held}
        flipped = [i for i in range(len(self.ledger))
                   if self.ledger.set_healthy(i, i not in self.unhealthy and i not in claimed)]
        if flipped:
            self.changed(flipped)

    def drop(self, uid: str) -> bool:
        self.take_mig(uid, ())
        self.waiting.pop(uid, None)
        if uid not in self.keys:
            return False
        touched = self._release(uid)
        touched.update(self._admit_waiting())
        self.changed(touched)
        return True

    def _displace_claims(self, uid: str, allocs: list[Allocation]) -> set[int] | None:
        """Count pod `uid` in place of the claims counted on its cards, when that makes it fit; the claims then wait
        (or stay, where they still fit). The cards the claims held; None, and nothing changed, when the pod does not
        fit even so."""
        cards = {i for a in allocs for i in a.cards}
        claims = {u: [self.ledger.allocations[k] for k in keys] for u, keys in self.keys.items()
                  if u.startswith(CLAIM_PREFIX) and any(cards & set(self.ledger.allocations[k].cards) for k in keys)}
        if not claims:
            return None
        released: set[int] = set()
        for u in claims:
            released |= self._release(u)
        if not self._assign(uid, allocs):
            for u, held in claims.items():
                self._assign(u, held)  # they were all counted together a moment ago
            return None
        for u, held in claims.items():
            if not self._assign(u, held):
                self.waiting[u] = held
                log.warning("node %s: %s waits: pod %s holds its cards (the node runs the pod)", self.name, u, uid)
        return released

    def _release(self, uid: str) -> set[int]:
        touched: set[int] = set()
        for k in self.keys.pop(uid, ()):
            gone = self.ledger.release(k)
            if gone is not None:
                touched.update(gone.cards)
        return touched

    def _admit_waiting(self) -> set[int]:
        """Count the waiting holdings that fit now, oldest first; the cards they take."""
        touched: set[int] = set()
        for other, allocs in list(self.waiting.items()):
            if self._assign(other, allocs):
                del self.waiting[other]
                touched.update(i for a in allocs for i in a.cards)
        return touched

    def holds(self, uid: str) -> bool:
        return uid in self.keys or uid in self.waiting

    def without(self, uid: str) -> Ledger:
        """A copy of the ledger without what `uid` holds (a pod being scheduled again)."""
        work = self.ledger.copy()
        for k in self.keys.get(uid, ()):
            work.release(k)
        return work

    def _assign(self, uid: str, allocs: list[Allocation]) -> bool:
        done = []
        try:
            for a in allocs:
                self.ledger.assign(a, check_health=False)
                done.append(a.key)
        except LedgerError:
            for k in done:
                self.ledger.release(k)
            return False
        self.keys[uid] = tuple(done)
        return True

    # -- caching --------------------------------------------------------------------------------------------
    def changed(self, cards: Iterable[int] | None = None) -> None:
        """The holdings on `cards` (None: any card) changed. The card rows are out of date until `refresh`."""
        if cards is None:
            self._touched = None
        elif self._touched is not None:
            self._touched.update(cards)
        self.stale = True
        self._state = None
        if self.on_change is not None:
            self.on_change(self.name)

    def refresh(self) -> None:
        """Bring the card rows and what is derived from them up to date with the ledger."""
        if not self.stale:
            return
        cards = self.ledger.cards
        if self._touched is None or len(self.rows) != len(cards):
            self.rows = [card_row(c) for c in cards]
        else:
            for i in self._touched:
                if 0 <= i < len(cards):
                    self.rows[i] = card_row(cards[i])
        self._touched = set()
        self.stale = False
        rows = self.rows
        self.whole = tuple((r.healthy, r.mode == "free") for r in rows)
        self.whole_key = sum((r.healthy << (2 * k)) | ((r.mode == "free") << (2 * k + 1)) for k, r in enumerate(rows))
        self.shared = tuple(sorted((r for r in rows if r.healthy and r.mode == "shared"),
                                   key=lambda r: (r.free_cores, r.free_memory_mib, r.index)))
        self.used_total = sum(min(r.used_cores, HUNDRED) for r in rows)

    def state(self, whole_only: bool) -> object:
        """The ledger as `place` sees it: equal states (on one shape) give equal placements.

        Whole-card requests only look at which cards are healthy and free; shares at every card's free cores
        and memory too."""
        self.refresh()
        if whole_only:
            return self.whole
        if self._state is None:
            self._state = tuple((r.healthy, r.mode, r.free_cores, r.free_memory_mib) for r in self.rows)
        return self._state


def full_state(ledger: Ledger) -> object:
    return tuple((c.healthy, c.mode, c.free_cores, c.free_memory_mib) for c in ledger.cards)


def whole_state(ledger: Ledger) -> object:
    return tuple((c.healthy, c.mode == "free") for c in ledger.cards)


class CardLike(Protocol):
    """What the fit steps read of a card: a ledger's `CardState` or a `CardRow`."""

    @property
    def index(self) -> int: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def mode(self) -> str: ...
    @property
    def used_cores(self) -> int: ...
    @property
    def free_cores(self) -> int: ...
    @property
    def free_memory_mib(self) -> int: ...


@dataclass(frozen=True, slots=True)
class CardRow:
    """One card of a ledger as plain values (what `CardState` derives from its holders)."""

    index: int
    memory_mib: int
    healthy: bool
    mode: str  # free | shared | exclusive
    used_cores: int
    free_cores: int
    free_memory_mib: int


def card_row(c: CardState) -> CardRow:
    return CardRow(index=c.index, memory_mib=c.memory_mib, healthy=c.healthy, mode=c.mode, used_cores=c.used_cores,
                   free_cores=c.free_cores, free_memory_mib=c.free_memory_mib)


def card_rows(ledger: Ledger) -> list[CardRow]:
    return [card_row(c) for c in ledger.cards]


def shape_of(gpus: NodeGPUs) -> tuple[object, ...]:
    """The interning key of a node's hardware."""
    inv = gpus.inventory
    return (inv.levels, tuple(g.name for g in inv.gpus), tuple(g.memory_mib for g in inv.gpus),
            tuple(g.minor for g in inv.gpus), tuple(g.numa_node for g in inv.gpus), gpus.memory_unit_mib)


def build_shape(ident: int, gpus: NodeGPUs) -> Shape:
    inv = gpus.inventory
    return Shape(ident=ident, topology=Topology.of(inv), models=tuple(g.name for g in inv.gpus),
                 memory_mib=tuple(g.memory_mib for g in inv.gpus), unit_mib=gpus.memory_unit_mib,
                 index_of_minor={g.minor: g.index for g in inv.gpus})


@dataclass(frozen=True, eq=False)
class Shape:
    ident: int
    topology: Topology
    models: tuple[str, ...]
    memory_mib: tuple[int, ...]
    unit_mib: int
    index_of_minor: dict[int, int] = field(default_factory=dict)

    def minors(self, cards: tuple[int, ...]) -> list[int]:
        minor_of = {i: m for m, i in self.index_of_minor.items()}
        return [minor_of[i] for i in cards]
