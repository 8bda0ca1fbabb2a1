"""`Plan`: the first verdicts of one pod ask on the nodes of one hardware shape, answered once per class of nodes.

Used by `ClusterView` (cluster.py) when a new ask's first call visits every node: nodes in the same state for the
ask (a share: by the tightest fitting shared card; whole cards: by which cards are healthy and free) get one Fit.
tests/extender/test_fit_cache.py holds these answers to the plain computation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumgr.allocator import HUNDRED
from gpumgr.allocator.fragment import rank_free
from gpumgr.extender.ask import PodAsk
from gpumgr.extender.fit import CARDS_WEIGHT, Fit, cards_part, fast_place, packing, tightest_shared
from gpumgr.extender.nodestate import NodeState, Shape
from gpumgr.topology.levels import LevelKey

MISSING: Any = object()

# ClusterView.classify: the whole cards a one-container whole-card pod takes on the node (None: it does not fit)
Classify = Callable[[Shape, PodAsk, tuple[bool, ...], NodeState], tuple[tuple[int, ...], ...] | None]
# ClusterView._first: the verdict of a node not cached for the ask (the last argument: one whole-card container)
First = Callable[[NodeState, Shape, PodAsk, bool], Fit]


class Plan:
    """The first verdicts of one ask on the nodes of one shape (no cordon, no per-pod card choices): nodes in
    the same state for this ask get the same Fit, found by a small key instead of placing again.

    A share goes on the first of the node's shared cards that fits (`fast_place`), and its Fit is then a function
    of that card's used cores and free memory and the node's used cores in all (`packing`). Whole cards are a
    function of which cards are healthy and free (`NodeState.whole_key`); their Fit, of that and the node's
    used cores, since a free card holds nothing (no cores, all its memory free). Anything else (no shared card
    fits, the pod does not fit, `spread`): None, and the view decides (`ClusterView._first`). Several shares:
    each on the tightest of the shared cards as the earlier ones left them, as long as one fits.

    Where every card is allowed, the packing of one container is made from two parts (`cards_part`, computed once
    per state of the cards it takes, and the node's used cores), and nodes whose cards and packing come out
    equal share one Fit (`_quick`): most nodes differ in some count, few in the answer."""

    def __init__(self, shape: Shape, ask: PodAsk, allowed: tuple[bool, ...], classify: Classify, first: First,
                 high_first: bool = False):
        self.shape, self.ask, self.allowed = shape, ask, allowed
        self.high_first = high_first  # the view's tie order (`gpumgr.allocator.choose`)
        self.classify, self.first = classify, first  # the view's (its class answers are cached across plans)
        need = ask.containers[0]
        self.whole = need.cores >= HUNDRED
        self.cores, self.mem = need.cores, need.memory_units * shape.unit_mib
        self.all_allowed = False not in allowed
        self.share = not self.whole and ask.choices.policy != "spread"
        self.several = [(c.cores, c.memory_units * shape.unit_mib) for c in ask.containers] if len(
            ask.containers) > 1 else []
        self.fits: dict[tuple[int, ...], Fit | None] = {}
        self.on_free: dict[int, tuple[tuple[int, ...], ...] | None] = {}  # healthy free cards -> where a share goes
        self.healthy_bits = sum(1 << (2 * k) for k in range(len(shape.memory_mib)))  # see NodeState.whole_key
        self.classes: dict[int, tuple[tuple[int, ...], ...] | Fit] = {}  # whole_key -> whole cards, or why not
        self.worsts: dict[tuple[tuple[int, ...], ...], LevelKey | None] = {}  # cards -> their worst link
        self.allowed_count = allowed.count(True)
        self.node_cores = HUNDRED * self.allowed_count  # `node_packing`'s parts, made once
        self.rest = 1 - CARDS_WEIGHT
        # what the cards a Fit takes are a function of: (card index, used cores, free memory) of the shared card a
        # share takes, (-2, healthy free cards) where it takes a free card, (-1, whole_key) for whole cards ->
        # cards_part of those cards, the cards, their worst link, the cards' number in `numbers`
        self.parts: dict[tuple[int, ...], tuple[float, int, tuple[tuple[int, ...], ...], LevelKey | None, int]] = {}
        self.made: dict[tuple[int, float], Fit] = {}  # (number of the cards in `numbers`, packing) -> Fit
        self.numbers: dict[tuple[tuple[int, ...], ...], int] = {}  # the cards of the parts, numbered
        # (healthy and free allowed cards, healthy allowed cards) -> the verdict where whole cards do not fit
        self.refusals: dict[tuple[int, int], Fit] = {}

    def fit(self, node: NodeState) -> Fit | None:
        key: tuple[int, ...]
        if self.several:
            return self._shares(node)
        if self.share:
            allowed = self.allowed
            r = tightest_shared(node.shared, self.cores, self.mem, allowed, self.high_first)
            if r is not None:
                if self.all_allowed:
                    return self._quick(node, ((r.index,),), (r.index, r.used_cores, r.free_memory_mib))
                key = (r.index, r.used_cores, r.free_memory_mib, self._used(node))
                fit = self.fits.get(key)
                if fit is None:
                    fit = self.fits[key] = self._make(node, ((r.index,),))
                return fit
            # no shared card fits: the share goes on a free card, chosen by which cards are both healthy and free
            # (`_share_pick`: those with the memory, in their order); the bits of `whole_key` where both are set
            free = node.whole_key & (node.whole_key >> 1) & self.healthy_bits
            placed = self.on_free.get(free, MISSING)
            if placed is MISSING:
                placed = self.on_free[free] = fast_place(self.shape.topology, node.rows, node.shared, allowed,
                                                         self.shape.unit_mib, self.ask, self.high_first)
            if placed is None:
                return None
            if self.all_allowed:
                return self._quick(node, placed, (-2, free))
            key = (-2, node.whole_key, self._used(node))
            if key not in self.fits:
                self.fits[key] = self._make(node, placed)
            return self.fits[key]
        if not self.whole:
            return None
        got = self.classes.get(node.whole_key)
        if got is None:
            cards = self.classify(self.shape, self.ask, self.allowed, node)
            got = self.classes[node.whole_key] = cards if cards is not None else self._refusal(node)
        if isinstance(got, Fit):
            return got
        if self.all_allowed:
            return self._quick(node, got, (-1, node.whole_key))
        key = (-1, node.whole_key, self._used(node))
        fit = self.fits.get(key)
        if fit is None:
            fit = self.fits[key] = self._make(node, got)
        return fit

    def _used(self, node: NodeState) -> int:
        """The used cores `packing` counts: on every card, or (a model filter) only on the allowed ones."""
        if self.all_allowed:
            return node.used_total
        allowed = self.allowed
        return sum(r.used_cores for r in node.rows if allowed[r.index])

    def _refusal(self, node: NodeState) -> Fit:
        """The verdict where whole cards do not fit: fewer allowed cards are healthy and free than the pod takes,
        and the answer (`quick_check`: not now, or never) counts them and the healthy ones; so it is one per count,
        not one per pattern of healthy and free cards."""
        allowed = self.allowed
        free = healthy = 0
        for r in node.rows:
            if allowed[r.index] and r.healthy:
                healthy += 1
                free += r.mode == "free"
        got = self.refusals.get((free, healthy))
        if got is None:
            got = self.refusals[free, healthy] = self.first(node, self.shape, self.ask, True)
        return got

    def _shares(self, node: NodeState) -> Fit | None:
        """Several shares, placed as `fast_place` places them: each on the tightest fitting shared card (as the
        earlier containers left it), else on a free card in `_share_pick`'s order (a free card holds nothing: all
        its cores and memory are free); None when one does not fit."""
        allowed, rows = self.allowed, node.rows
        left = {r.index: [r.free_cores, r.free_memory_mib, r.used_cores] for r in node.shared if allowed[r.index]}
        free = [r.index for r in rows if r.healthy and r.mode == "free" and allowed[r.index]]
        out = []
        sign = -1 if self.high_first else 1
        for cores, mem in self.several:
            best: tuple[int, int, int] | None = None
            for i, (free_cores, free_mem, _used) in left.items():
                if free_cores >= cores and free_mem >= mem and (best is None
                                                                 or (free_cores, free_mem, sign * i) < best):
                    best = (free_cores, free_mem, sign * i)
            if best is not None:
                i = sign * best[2]
                card = left[i]
                card[2] += cores
                card[0] = max(0, HUNDRED - card[2])
                card[1] -= mem
            else:
                fitting = [c for c in free if rows[c].memory_mib >= mem]
                if not fitting:
                    return None
                ranked = rank_free(self.shape.topology, fitting, self.high_first)
                if self.ask.choices.policy == "topology":
                    i = ranked[0]
                else:
                    rank = {c: k for k, c in enumerate(ranked)}
                    i = min(fitting, key=lambda c: (rows[c].memory_mib - mem, rank[c], c))
                free.remove(i)
                left[i] = [max(0, HUNDRED - cores), rows[i].memory_mib - mem, cores]
            out.append((i,))
        return self._make(node, tuple(out))

    def _quick(self, node: NodeState, placed: tuple[tuple[int, ...], ...], part_key: tuple[int, ...]) -> Fit:
        """The Fit of one container on the cards `placed` (every card allowed): `packing` from the part of those
        cards (the same for every node whose `part_key` is the same) and the node's used cores."""
        part = self.parts.get(part_key)
        if part is None:
            worst = self.shape.topology.worst(placed[0]) if len(placed[0]) > 1 else None
            number = self.numbers.setdefault(placed, len(self.numbers))
            part = self.parts[part_key] = (*cards_part(placed[0], node.rows, self.shape.unit_mib, self.ask), placed,
                                           worst, number)
        on_cards, added, cards, worst, number = part
        p = CARDS_WEIGHT * on_cards + self.rest * ((node.used_total + added) / self.node_cores)  # node_packing
        fit = self.made.get((number, p))
        if fit is None:
            fit = self.made[number, p] = Fit.placed_at(cards, worst, p)
        return fit

    def _make(self, node: NodeState, placed: tuple[tuple[int, ...], ...]) -> Fit:
        p = packing(placed, node.rows, self.allowed, self.shape.unit_mib, self.ask,
                    node.used_total if self.all_allowed else None)
        if len(placed) == 1 and len(placed[0]) == 1:
            return Fit.placed_at(placed, None, p)
        if placed not in self.worsts:  # the same few sets on many nodes
            self.worsts[placed] = max((self.shape.topology.worst(c) for c in placed if len(c) > 1), default=None)
        return Fit.placed_at(placed, self.worsts[placed], p)
