"""Placing all GPU containers of a pod on one node at once, with the allocator's own `choose`.

Three steps, cheapest first:
  `static_check`  what never changes for a node's hardware: the cards of an accepted model, and requests that
                  no state of the node could satisfy (InvalidRequest) — unresolvable;
  `quick_check`   for a pod with one GPU container, the filter verdict from the ledger alone (a card with
                  enough free cores and memory; enough free whole cards), exactly when `choose` would succeed;
  `place`         `choose` for each container in spec order on a copy of the ledger, each seeing the cards the
                  earlier ones took; cards of a model the pod does not accept are marked unhealthy on that copy.
`place` is a pure function of (topology, ledger state, ask, tie order): the cluster view memoises it.
`with_packing` adds the packing measure that prioritize scores on. `high_first` (every step the same): among cards
equally good, the highest number rather than the lowest (`gpumgr.allocator.choose`), as the view does when it counts
DRA claims.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpumgr.allocator import Allocation, InvalidRequest, Ledger, NoFit, Request, choose
from gpumgr.allocator.fragment import rank_free, rank_spread_among
from gpumgr.allocator.link import link_among
from gpumgr.allocator.request import HUNDRED
from gpumgr.extender.ask import ContainerNeed, PodAsk
from gpumgr.extender.nodestate import CardLike, CardRow, card_rows
from gpumgr.topology.cost import Topology
from gpumgr.topology.levels import LevelKey

CARDS_WEIGHT = 0.75  # packing: fullness of the cards the pod would use; the rest is the whole node's fullness


def static_check(models: Sequence[str], memory_mib: Sequence[int], unit_mib: int,
                 ask: PodAsk) -> tuple[tuple[bool, ...], Fit | None]:
    """(cards of an accepted model, an unresolvable Fit or None): what depends only on the node's hardware."""
    if ask.invalid:
        return (), Fit.never(ask.invalid)
    allowed = tuple(ask.allows(m) for m in models)
    if not any(allowed):
        return allowed, Fit.never(_model_reason(models, ask))
    usable = [i for i, ok in enumerate(allowed) if ok]
    largest = max(memory_mib[i] for i in usable)
    for need in ask.containers:
        try:
            request(need, unit_mib).validate(len(usable), largest)
        except InvalidRequest as e:
            where = "" if len(usable) == len(models) else f" ({len(usable)} of its {len(models)} cards accepted)"
            return allowed, Fit.never(f"container {need.name}: {e}{where}")
    return allowed, None


def quick_check(cards: Sequence[CardLike], allowed: tuple[bool, ...], unit_mib: int, ask: PodAsk) -> Fit | None:
    """The verdict for a pod with one GPU container without running an evaluator (None: more containers).
    `cards`: a ledger's cards, or the card rows of a node (`NodeState.rows`).

    Call after `static_check` passed. A passing verdict has no cards yet (`placed` False).
    """
    if len(ask.containers) != 1:
        return None
    need = ask.containers[0]
    req = request(need, unit_mib)
    if req.whole:
        free = sum(1 for i, ok in enumerate(allowed) if ok and cards[i].healthy and cards[i].mode == "free")
        if free >= req.cards_needed:
            return UNPLACED
    else:
        for i, ok in enumerate(allowed):
            c = cards[i]
            if (ok and c.healthy and c.free_cores >= req.cores and c.free_memory_mib >= req.memory_mib
                    and c.mode != "exclusive"):
                return UNPLACED
    reason = f"container {need.name}: {_shortfall(cards, cards, allowed, req)}"
    return _not_now_or_never(reason, cards, allowed, unit_mib, ask)


def place(topo: Topology, ledger: Ledger, allowed: tuple[bool, ...], unit_mib: int, ask: PodAsk,
          high_first: bool = False) -> Fit:
    """Cards for every GPU container, or why not. Call after `static_check` passed. No packing yet."""
    placed = _place(topo, ledger, allowed, unit_mib, ask, high_first)
    if isinstance(placed, str):
        return _not_now_or_never(placed, ledger.cards, allowed, unit_mib, ask, topo)
    multi = [c for c in placed if len(c) > 1]
    worst = max((topo.worst(c) for c in multi), default=None)
    return Fit(ok=True, unresolvable=False, reason="", cards=placed, worst=worst, placed=True)


def with_packing(fit: Fit, ledger: Ledger, allowed: tuple[bool, ...], unit_mib: int, ask: PodAsk) -> Fit:
    """`fit` with `packing`: 0..1, how full the cards the pod would use (and the node) are afterwards."""
    if not fit.ok or not fit.placed:
        return fit
    return replace(fit, packing=packing(fit.cards, card_rows(ledger), allowed, unit_mib, ask))


def packing(placed: tuple[tuple[int, ...], ...], cards: Sequence[CardRow], allowed: tuple[bool, ...],
            unit_mib: int, ask: PodAsk, used_total: int | None = None) -> float:
    """The packing measure of `with_packing`. `used_total`: the sum of `min(used cores, 100)` over the allowed
    cards, when the caller knows it (the sum is of integers: the same whichever way it is made)."""
    if len(placed) == 1 and used_total is not None:  # the common case (each card once), in short
        on_cards, added = cards_part(placed[0], cards, unit_mib, ask)
        return node_packing(on_cards, used_total + added, allowed.count(True))
    add_cores: dict[int, int] = {}
    add_mem: dict[int, int] = {}
    for need, chosen in zip(ask.containers, placed, strict=True):
        whole = need.cores >= HUNDRED
        for i in chosen:
            add_cores[i] = add_cores.get(i, 0) + (HUNDRED if whole else need.cores)
            add_mem[i] = add_mem.get(i, 0) + (cards[i].memory_mib if whole else need.memory_units * unit_mib)

    on_cards = 0.0
    changed = 0  # how much the pod adds to the allowed cards' used cores (each card counted up to 100)
    for i, add in add_cores.items():
        c = cards[i]
        taken = min(c.used_cores + add, HUNDRED)
        used_mem = c.memory_mib - c.free_memory_mib + add_mem[i]
        on_cards += (taken / HUNDRED + (min(used_mem / c.memory_mib, 1.0) if c.memory_mib else 1.0)) / 2
        if allowed[i]:
            changed += taken - min(c.used_cores, HUNDRED)
    on_cards /= len(add_cores)
    if used_total is None:
        used_total = sum(min(cards[i].used_cores, HUNDRED) for i, ok in enumerate(allowed) if ok)
    on_node = (used_total + changed) / (HUNDRED * allowed.count(True))
    return CARDS_WEIGHT * on_cards + (1 - CARDS_WEIGHT) * on_node


def cards_part(chosen: tuple[int, ...], cards: Sequence[CardRow], unit_mib: int, ask: PodAsk) -> tuple[float, int]:
    """`packing` of one container of `ask` on the cards `chosen`, in two parts: how full those cards are afterwards
    (0..1), and how much the pod adds to the node's used cores (each card counted up to 100). A function of those
    cards' rows only: the first call of a new ask computes it once per card state, not once per node."""
    need = ask.containers[0]
    whole = need.cores >= HUNDRED
    added = 0
    on_cards = 0.0
    for i in chosen:
        c = cards[i]
        taken = min(c.used_cores + (HUNDRED if whole else need.cores), HUNDRED)
        used_mem = c.memory_mib - c.free_memory_mib + (c.memory_mib if whole else need.memory_units * unit_mib)
        on_cards += (taken / HUNDRED + (min(used_mem / c.memory_mib, 1.0) if c.memory_mib else 1.0)) / 2
        added += taken - min(c.used_cores, HUNDRED)
    return on_cards / len(chosen), added


def node_packing(on_cards: float, total: int, cards_allowed: int) -> float:
    """`packing` from its parts: the fullness of the cards used (`cards_part`) and the node's used cores after."""
    return CARDS_WEIGHT * on_cards + (1 - CARDS_WEIGHT) * (total / (HUNDRED * cards_allowed))


def fast_place(topo: Topology, cards: Sequence[CardRow], shared: Sequence[CardRow], allowed: tuple[bool, ...],
               unit_mib: int, ask: PodAsk, high_first: bool = False) -> tuple[tuple[int, ...], ...] | None:
    """The cards `place` chooses, read from card rows instead of a ledger, for the pods that are most of the
    work: every GPU container a share of one card, or one container of whole cards. None when it does not apply,
    or when a container does not fit (`place` then says why). Call after `static_check` passed.

    `shared`: the healthy shared cards by (free cores, free memory, index). `binpack` and `topology` take the
    first of them that fits (`choose_share` puts every shared card before the free ones, then orders them so),
    which saves looking at the other cards."""
    policy = ask.choices.policy
    first = ask.containers[0]
    if len(ask.containers) == 1 and first.cores >= HUNDRED:
        free = [r.index for r in cards if r.healthy and r.mode == "free" and allowed[r.index]]
        count = first.cores // HUNDRED
        if len(free) < count:
            return None
        if count > 1:
            return (link_among(topo, free, free, count, high_first),)
        if policy == "spread":
            return ((rank_spread_among(topo, [r.index for r in cards if r.mode != "free"], free, high_first)[0],),)
        return ((rank_free(topo, free, high_first)[0],),)
    if len(ask.containers) == 1 and policy != "spread":
        r = tightest_shared(shared, first.cores, first.memory_units * unit_mib, allowed, high_first)
        if r is not None:
            return ((r.index,),)
    work = list(cards)
    out = []
    for need in ask.containers:
        if need.cores >= HUNDRED:
            return None
        mem = need.memory_units * unit_mib
        i = _share_pick(topo, work, allowed, need.cores, mem, policy, high_first)
        if i is None:
            return None
        r = work[i]
        used = r.used_cores + need.cores
        work[i] = CardRow(index=i, memory_mib=r.memory_mib, healthy=r.healthy, mode="shared", used_cores=used,
                          free_cores=max(0, HUNDRED - used), free_memory_mib=r.free_memory_mib - mem)
        out.append((i,))
    return tuple(out)


def tightest_shared(shared: Sequence[CardRow], cores: int, mem: int, allowed: tuple[bool, ...],
                    high_first: bool = False) -> CardRow | None:
    """The shared card `choose_share` takes for one share under `binpack` or `topology`, from `shared` (the healthy
    shared cards by (free cores, free memory, index), `NodeState.shared`): the first that fits; of equally tight
    ones, the lowest number, or the highest with `high_first`. None: no shared card fits."""
    found = None
    for r in shared:
        if found is not None and (r.free_cores != found.free_cores or r.free_memory_mib != found.free_memory_mib):
            break
        if r.free_cores >= cores and r.free_memory_mib >= mem and allowed[r.index]:
            if not high_first:
                return r
            found = r
    return found


def _share_pick(topo: Topology, cards: Sequence[CardRow], allowed: tuple[bool, ...], cores: int, mem: int,
                policy: str, high_first: bool = False) -> int | None:
    """`choose_share` on card rows whose cards outside `allowed` count as unhealthy (as `place` marks them)."""
    sign = -1 if high_first else 1
    if policy != "spread":  # a shared card that fits comes first, the one that fits tightest (see `fast_place`)
        best: tuple[int, int, int] | None = None
        for r in cards:
            if (r.mode == "shared" and r.healthy and allowed[r.index] and r.free_cores >= cores
                    and r.free_memory_mib >= mem):
                k = (r.free_cores, r.free_memory_mib, sign * r.index)
                if best is None or k < best:
                    best = k
        if best is not None:
            return sign * best[2]
    fitting = [r for r in cards if allowed[r.index] and r.healthy and r.mode != "exclusive"
               and r.free_cores >= cores and r.free_memory_mib >= mem]
    if not fitting:
        return None
    free = [r.index for r in fitting if r.mode == "free"]
    if policy == "spread":
        ranked = rank_spread_among(topo, [r.index for r in cards if r.mode != "free"], free, high_first)
    else:
        ranked = rank_free(topo, free, high_first)
    free_order = {c: k for k, c in enumerate(ranked)}

    def key(c: CardRow) -> tuple[object, ...]:
        rank = free_order.get(c.index, 0)
        last = sign * c.index
        if policy == "spread":
            return (-c.free_cores, -c.free_memory_mib, rank, last)
        if policy == "topology":
            return (c.mode == "free", rank, c.free_cores - cores, c.free_memory_mib - mem, last)
        return (c.mode == "free", c.free_cores - cores, c.free_memory_mib - mem, rank, last)

    return min(fitting, key=key).index


def fit_pod(topo: Topology, ledger: Ledger, models: Sequence[str], unit_mib: int, ask: PodAsk,
            high_first: bool = False) -> Fit:
    """All three steps, uncached: where the pod's GPU containers go on this node, or why they cannot."""
    allowed, never = static_check(models, [c.memory_mib for c in ledger.cards], unit_mib, ask)
    if never is not None:
        return never
    return with_packing(place(topo, ledger, allowed, unit_mib, ask, high_first), ledger, allowed, unit_mib, ask)


def request(need: ContainerNeed, unit_mib: int) -> Request:
    return Request(cores=need.cores, memory_mib=need.memory_units * unit_mib)


def _place(topo: Topology, ledger: Ledger, allowed: tuple[bool, ...], unit_mib: int,
           ask: PodAsk, high_first: bool = False) -> tuple[tuple[int, ...], ...] | str:
    work = ledger.copy()
    for i, ok in enumerate(allowed):
        if not ok:
            work.set_healthy(i, False)
    out = []
    for need in ask.containers:
        req = request(need, unit_mib)
        try:
            placement = choose(topo, work, req, policy=ask.choices.policy, high_first=high_first)
        except (NoFit, InvalidRequest):
            return f"container {need.name}: {_shortfall(work.cards, ledger.cards, allowed, req)}"
        work.assign(Allocation(key=f"pending/{need.index}", cards=placement.cards, cores=req.cores,
                               memory_mib=req.memory_mib))
        out.append(placement.cards)
    return tuple(out)


def _not_now_or_never(reason: str, cards: Sequence[CardLike], allowed: tuple[bool, ...], unit_mib: int, ask: PodAsk,
                      topo: Topology | None = None) -> Fit:
    """Unresolvable when the pod would not fit even on this node emptied of pods (unhealthy cards, or
    containers that together ask more than the node has): preemption cannot help there."""
    healthy = [i for i, ok in enumerate(allowed) if ok and cards[i].healthy]
    if len(ask.containers) == 1:
        req = request(ask.containers[0], unit_mib)
        if req.whole:
            fits_empty = len(healthy) >= req.cards_needed
        else:
            fits_empty = any(cards[i].memory_mib >= req.memory_mib for i in healthy)
    else:
        assert topo is not None
        empty = Ledger(c.memory_mib for c in cards)
        for c in cards:
            empty.set_healthy(c.index, c.healthy)
        fits_empty = not isinstance(_place(topo, empty, allowed, unit_mib, ask), str)
    if fits_empty:
        return Fit.not_now(reason)
    sick = sum(1 for i, ok in enumerate(allowed) if ok and not cards[i].healthy)
    why = f" ({sick} unhealthy card{'s' if sick != 1 else ''})" if sick else ""
    return Fit.never(f"{reason}; it would not fit even with no other pods on the node{why}")


def _shortfall(work: Sequence[CardLike], original: Sequence[CardLike], allowed: tuple[bool, ...],
               req: Request) -> str:
    """What is missing, counting only cards of an accepted model (`work` may hide the others as unhealthy)."""
    usable = [i for i, ok in enumerate(allowed) if ok]
    if not req.whole:
        shareable = [work[i] for i in usable if work[i].healthy and work[i].mode != "exclusive"]
        head = f"needs {req.cores} cores and {req.memory_mib} MiB on one card"
        if not shareable:
            healthy = sum(1 for i in usable if work[i].healthy)
            if not healthy:
                return f"{head}; no card is healthy"
            whole = f"all {healthy} healthy cards are held whole" if healthy > 1 else "the healthy card is held whole"
            return f"{head}; {whole} by whole-card pods"
        return (f"{head}; the best cards have {max(c.free_cores for c in shareable)} free cores and "
                f"{max(c.free_memory_mib for c in shareable)} MiB free")
    free = sum(1 for i in usable if work[i].healthy and work[i].mode == "free")
    sick = sum(1 for i in usable if not original[i].healthy)
    busy = len(usable) - free - sick
    scope = "cards" if len(usable) == len(allowed) else "cards of an accepted model"
    need = req.cards_needed
    return (f"needs {need} free whole card{'s' if need > 1 else ''}; {free} of the node's {len(usable)} {scope} "
            f"{'is' if free == 1 else 'are'} free ({busy} in use, {sick} unhealthy)")


def _model_reason(models: Sequence[str], ask: PodAsk) -> str:
    have = sorted(set(models))
    wanted = []
    if ask.accepted:
        wanted.append(f"gpu-model {','.join(ask.accepted)}")
    if ask.refused:
        wanted.append(f"not gpu-model-exclude {','.join(ask.refused)}")
    return f"no card matches {' and '.join(wanted)}; the node has {', '.join(have) or 'no cards'}"


@dataclass(frozen=True, eq=False, slots=True)
class Fit:
    ok: bool
    unresolvable: bool  # True: this node can never take the pod (preemption will not help)
    reason: str  # why not, naming the shortfall ("" when ok)
    cards: tuple[tuple[int, ...], ...] = ()  # per GPU container (ask order): card indices on the node
    worst: LevelKey | None = None  # the worst link inside any multi-card container's set
    packing: float = 0.0  # 0..1: how full the used cards (and the node) are afterwards; see with_packing
    placed: bool = False  # cards (and worst, packing) are known; a quick verdict has only `ok`
    # `packing` on the 0..10 scale of extender scores; 0 when the pod does not fit (an attribute: prioritize reads
    # it for thousands of nodes per call)
    points: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", round(self.packing * 10) if self.ok else 0)

    @classmethod
    def placed_at(cls, cards: tuple[tuple[int, ...], ...], worst: LevelKey | None, packing: float) -> Fit:
        """A fitting, placed Fit, made the fast way: the first call of a new ask makes one per node."""
        fit = object.__new__(cls)
        # frozen: its own __setattr__ refuses; the slots' own setters are the quickest way in
        ok, unresolvable, reason, cards_, worst_, packing_, placed, points = _SETTERS
        ok(fit, True)
        unresolvable(fit, False)
        reason(fit, "")
        cards_(fit, cards)
        worst_(fit, worst)
        packing_(fit, packing)
        placed(fit, True)
        points(fit, round(packing * 10))
        return fit

    @classmethod
    def not_now(cls, reason: str) -> Fit:
        return cls(ok=False, unresolvable=False, reason=reason)

    @classmethod
    def never(cls, reason: str) -> Fit:
        return cls(ok=False, unresolvable=True, reason=reason)


UNPLACED = Fit(ok=True, unresolvable=False, reason="")
# the setters of Fit's slots, in `placed_at`'s order (a tuple: nothing to change)
_SETTERS = tuple(getattr(Fit, f).__set__ for f in ("ok", "unresolvable", "reason", "cards", "worst", "packing",
                                                   "placed", "points"))
