"""The cluster view: every node's GPUs and holdings, every GPU pod, and the holdings binds have assumed.

Fed by the watches (`set_node`, `set_pod`, ...) and by bind (`assume`, `forget`), all on one event loop, so
a filter or bind step that does not await sees one consistent state. What a pod holds is decided in one
place (`_reconcile`): the holding a bind assumed, until the pod's annotations with that bind's predicate-time
are observed; otherwise what its annotations say.

Fits are cached per node and per pod ask until the node changes, and memoised across nodes by (hardware
shape, ledger state, ask), since `fit_pod` is a pure function of those. A new ask's first call visits every node:
it reads each node's card rows (`NodeState`, kept up to date as pods come and go) instead of the ledger, and
answers nodes that are alike for that ask once (`Plan`, plan.py): a share by the node's tightest fitting shared
card, whole cards by which cards are healthy and free. tests/extender/test_fit_cache.py holds these to the plain
computation.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.allocator import HUNDRED, Allocation, Ledger
from gpumgr.allocator.fragment import rank_every_set
from gpumgr.allocator.ledger import CLAIM_PREFIX, ClaimHolder, LedgerError
from gpumgr.extender.ask import PodAsk, pod_uid
from gpumgr.extender.claims import FINISHED, Claim, pod_claim
from gpumgr.extender.fit import Fit, fast_place, packing, place, quick_check, static_check, with_packing
from gpumgr.extender.migfit import mig_reason
from gpumgr.extender.nodestate import NodeState, Shape, Taken, build_shape, full_state, shape_of, whole_state
from gpumgr.extender.plan import Plan
from gpumgr.node.inventory import InventoryAnnotationError, decode
from gpumgr.requests import podspec
from gpumgr.requests.choices import ANN_CORDON, allowed_cards, node_cordon
from gpumgr.requests.claim_results import DriverResult
from gpumgr.requests.mig_ask import mig_asks

log = logging.getLogger(__name__)

MAX_MEMO = 50_000  # placements remembered across nodes
MAX_ASKS = 64  # distinct pod asks whose per-node verdicts and placements are cached
MISSING: Any = object()
REUSE_FROM = 64  # uncached placements in a call from which `_reuse` looks at every name (after a new ask's filter)


class ClusterView:
    def __init__(self, high_first: bool = False) -> None:
        # among equally good cards, the highest number first (`gpumgr.allocator.choose`): set where DRA claims are
        # counted, so that the extender and kube-scheduler's DRA allocator (gpu-0 first) take a node's cards from
        # opposite ends; every placement path of the view (plain, `fast_place`, `Plan`) breaks ties the same way
        self.high_first = high_first
        self.nodes: dict[str, NodeState] = {}
        self.synced: set[str] = set()  # "nodes", "pods" once their first list is in
        self.needs = {"nodes", "pods"}  # the lists the view waits for before it is ready ("resourceclaims" too)
        self._node_text: dict[str, bytes | None] = {}  # digest of each node's inventory annotation
        self._node_cordon: dict[str, bytes | None] = {}  # digest of each node's gpumgr.io/cordoned-gpus
        self._shapes: dict[tuple[object, ...], Shape] = {}
        self._pods: dict[str, tuple[str, str, bytes]] = {}  # GPU pods by UID: namespace, name, compact JSON
        self._by_name: dict[tuple[str, str], str] = {}
        self._claims: dict[str, Claim] = {}
        self._assumed: dict[str, Assumption] = {}
        self._void: dict[str, str] = {}  # pod UID -> predicate-time of a failed bind whose claim does not count
        self._applied: dict[str, str] = {}  # pod UID -> node whose ledger has its holding
        self._wanted: dict[str, set[str]] = {}  # node -> pod UIDs whose holding belongs there
        self._wanted_at: dict[str, str] = {}  # the reverse: pod UID -> node
        self._verdicts: dict[str, dict[str, Fit]] = {}  # ask key -> node -> verdict (filter)
        self._placements: dict[str, dict[str, Fit]] = {}  # ask key -> node -> placement (prioritize, bind)
        self._memo: dict[tuple[object, ...], Fit] = {}  # (shape, state, ask, cards) -> fit
        # (shape, healthy free cards, ask, cards) -> the cards a one-container whole-card pod takes (None: none)
        self._classes: dict[tuple[object, ...], tuple[tuple[int, ...], ...] | None] = {}
        self._statics: dict[tuple[int, str], tuple[tuple[bool, ...], Fit | None]] = {}
        # allocated DRA claims of our driver: claim UID -> node -> its results there; and node -> claim UIDs
        self._dra: dict[str, DraClaim] = {}
        self._dra_at: dict[str, set[str]] = {}
        # pods bound to a node that ask MIG instances of the device plugins: UID -> (node, {resource: count}),
        # and node -> {resource: instances those pods hold}
        self._mig_pods: dict[str, tuple[str, dict[str, int]]] = {}
        self._mig_used: dict[str, dict[str, int]] = {}

    @property
    def ready(self) -> bool:
        return self.needs <= self.synced

    # -- nodes ----------------------------------------------------------------------------------------------
    def set_node(self, name: str, inventory_text: str | None, cordon_text: str | None = None) -> None:
        """A node was added or changed; `inventory_text` is its gpumgr.io/gpu-inventory annotation, `cordon_text`
        its gpumgr.io/cordoned-gpus."""
        digest = None if inventory_text is None else hashlib.blake2b(inventory_text.encode(), digest_size=16).digest()
        cordon = None if cordon_text is None else hashlib.blake2b(cordon_text.encode(), digest_size=16).digest()
        if (name in self.nodes and name in self._node_text and self._node_text[name] == digest
                and self._node_cordon.get(name) == cordon):
            return
        self._node_text[name] = digest
        self._node_cordon[name] = cordon
        old = self.nodes.get(name)
        turn = {u: i for i, u in enumerate([*old.keys, *old.waiting])} if old is not None else {}
        self.nodes[name] = self._build_node(name, inventory_text)
        if self.nodes[name].shape is not None:
            ann = {} if cordon_text is None else {ANN_CORDON: cordon_text}
            self.nodes[name].cordon = node_cordon(ann, self.nodes[name].gpus)
            if self.nodes[name].cordon.error:
                log.warning("node %s: %s", name, self.nodes[name].cordon.error)
        self._node_changed(name)
        last = len(turn)  # holdings counted again in the order they were counted before (new ones after)
        for uid in sorted(self._wanted.get(name, ()), key=lambda u: (turn.get(u, last), u)):
            self._applied.pop(uid, None)
            self._reconcile(uid)
        for uid in sorted(self._dra_at.get(name, ()), key=lambda u: (turn.get(CLAIM_PREFIX + u, last), u)):
            self._hold_claim(uid, name)

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self._node_text.pop(name, None)
        self._node_cordon.pop(name, None)
        self._node_changed(name)
        for uid in self._wanted.get(name, ()):
            self._applied.pop(uid, None)

    def replace_nodes(self, nodes: Mapping[str, str | None], cordons: Mapping[str, str | None] | None = None) -> None:
        """The full node list (after a list or re-list), with each node's cordon annotation when known."""
        for name in [n for n in self.nodes if n not in nodes]:
            self.remove_node(name)
        for name, text in nodes.items():
            self.set_node(name, text, (cordons or {}).get(name))
        self.synced.add("nodes")
        if self.ready:
            self.refresh()

    def _build_node(self, name: str, text: str | None) -> NodeState:
        if text is None:
            return NodeState(name, None, problem=f"the node has no {podspec.ANN_NODE_INVENTORY} annotation "
                             "(is the gpumgr agent running there?)", on_change=self._node_changed)
        try:
            gpus = decode(text)
            key = shape_of(gpus)
            shape = self._shapes.get(key)
            if shape is None:
                shape = build_shape(len(self._shapes), gpus)
                self._shapes[key] = shape
                rank_every_set(shape.topology, high_first=self.high_first)
        except (InventoryAnnotationError, ValueError) as e:
            log.warning("node %s: unusable %s annotation: %s", name, podspec.ANN_NODE_INVENTORY, e)
            return NodeState(name, None, problem=f"the node's {podspec.ANN_NODE_INVENTORY} annotation is "
                             f"unusable: {e}", on_change=self._node_changed)
        if not shape.models:
            return NodeState(name, None, problem="the node reports no GPUs", on_change=self._node_changed)
        node = NodeState(name, shape, unhealthy=gpus.unhealthy, on_change=self._node_changed)
        node.gpus = gpus.inventory.gpus
        node.mig = gpus.mig
        return node

    # -- pods -----------------------------------------------------------------------------------------------
    def set_pod(self, pod: dict[str, Any]) -> None:
        """A pod was added or changed. Only GPU pods are kept."""
        uid = pod_uid(pod)
        try:
            gpu = podspec.is_gpu_pod(pod)
        except (ValueError, AttributeError):
            gpu = False
        if not gpu:
            if uid in self._pods:
                self.remove_pod(pod)
            self._set_mig_pod(uid, pod)
            return
        self._set_mig_pod(uid, pod)
        meta = pod.get("metadata") or {}
        old = self._pods.get(uid)
        if old is not None:
            self._by_name.pop((old[0], old[1]), None)
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        self._pods[uid] = (*key, json.dumps(pod, separators=(",", ":")).encode())  # a third of a dict's memory
        self._by_name[key] = uid
        claim = pod_claim(pod)
        if claim is None:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = claim
        assumed = self._assumed.get(uid)
        finished = ((pod.get("status") or {}).get("phase")) in FINISHED
        if assumed is not None and (finished or (claim is not None and claim.predicate_time == assumed.time)):
            del self._assumed[uid]
        void = self._void.get(uid)
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if void is not None and (bound or claim is None or claim.predicate_time != void):
            # the failed bind's annotations are gone (or replaced) - or the Binding was made after all (its answer
            # was lost): a bound pod's claim always counts
            del self._void[uid]
        self._reconcile(uid)

    def remove_pod(self, pod: Mapping[str, Any]) -> None:
        self._remove_pod(pod_uid(pod))

    def _remove_pod(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            key = (old[0], old[1])
            if self._by_name.get(key) == uid:
                del self._by_name[key]
        self._claims.pop(uid, None)
        self._assumed.pop(uid, None)
        self._void.pop(uid, None)
        self._set_mig_pod(uid, {})
        self._reconcile(uid)

    def replace_pods(self, pods: Iterable[dict[str, Any]]) -> None:
        """The full pod list (after a list or re-list)."""
        pods = list(pods)
        seen = {pod_uid(p) for p in pods}
        for uid in [u for u in self._pods if u not in seen]:
            self._remove_pod(uid)
        for uid in [u for u in self._mig_pods if u not in seen]:  # pods asking only MIG instances
            self._set_mig_pod(uid, {})
        for p in pods:
            self.set_pod(p)
        self.synced.add("pods")
        if self.ready:
            self.refresh()

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the view keeps it (a fresh copy), or None."""
        uid = self._by_name.get((namespace, name))
        stored = self._pods.get(uid) if uid else None
        return json.loads(stored[2]) if stored is not None else None

    # -- DRA claims -----------------------------------------------------------------------------------------
    def set_claim(self, uid: str, namespace: str, name: str, results: tuple[DriverResult, ...]) -> None:
        """A ResourceClaim was added or changed: `results` are its allocation's results of our driver (empty:
        it holds nothing of ours, or no longer). Each becomes a holding `dra/<uid>/<n>` on its node's card, as the
        node's ledger has it; a claim on a node not known yet is counted when the node arrives."""
        per_node: dict[str, tuple[DriverResult, ...]] = {}
        for r in results:
            per_node[r.pool] = (*per_node.get(r.pool, ()), r)
        old = self._dra.get(uid)
        if old is not None and old.per_node == per_node:
            return  # most changes of a claim (reservedFor, conditions) leave the allocation alone
        self.remove_claim(uid)
        if not per_node:
            return
        self._dra[uid] = DraClaim(namespace=namespace, name=name, per_node=per_node)
        for node_name in per_node:
            self._dra_at.setdefault(node_name, set()).add(uid)
            self._hold_claim(uid, node_name)

    def remove_claim(self, uid: str) -> None:
        old = self._dra.pop(uid, None)
        if old is None:
            return
        for node_name in old.per_node:
            uids = self._dra_at.get(node_name)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._dra_at[node_name]
            node = self.nodes.get(node_name)
            if node is not None:
                node.drop(CLAIM_PREFIX + uid)

    def replace_claims(self, claims: Iterable[tuple[str, str, str, tuple[DriverResult, ...]]]) -> None:
        """The full list of claims (after a list or re-list): (uid, namespace, name, results) each."""
        claims = [c for c in claims if c[3]]
        seen = {c[0] for c in claims}
        for uid in [u for u in self._dra if u not in seen]:
            self.remove_claim(uid)
        for c in claims:
            self.set_claim(*c)
        self.synced.add("resourceclaims")
        if self.ready:
            self.refresh()

    def claims_on(self, node_name: str) -> list[str]:
        """UIDs of the DRA claims counted (or waiting to be) on the node."""
        return sorted(self._dra_at.get(node_name, ()))

    def _hold_claim(self, uid: str, node_name: str) -> None:
        """Put the claim's results on `node_name` into its ledger (a holding that conflicts with others waits,
        as a pod's does: the cluster says it is allocated, the view may be behind). Results the node cannot have
        (no such card, more memory than the card has) make the node refuse the claim: then it holds nothing."""
        claim = self._dra.get(uid)
        node = self.nodes.get(node_name)
        if claim is None or node is None or node.shape is None:
            return
        cards = node.shape.memory_mib
        allocs = []
        taken = []
        try:
            holder = ClaimHolder(uid=uid, namespace=claim.namespace, name=claim.name)
            for r in claim.per_node.get(node_name, ()):
                if r.mig is not None:  # a MIG device: its placement, and its card out of whole/fractional use
                    taken.append(self._mig_taken(node, node_name, r.index, *r.mig))
                    continue
                if r.index >= len(cards) or (r.memory_mib is not None and r.memory_mib > cards[r.index]):
                    raise LedgerError(f"node {node_name} has no room for gpu-{r.index} ({r.memory_mib} MiB)")
                memory = cards[r.index] if r.memory_mib is None else r.memory_mib
                allocs.append(Allocation(key=f"{CLAIM_PREFIX}{uid}/{r.n}", cards=(r.index,), cores=r.cores,
                                         memory_mib=memory, holder=holder, verified=True))
        except LedgerError as e:
            log.warning("claim %s/%s: %s; not counted (the node refuses it too)", claim.namespace, claim.name, e)
            node.drop(CLAIM_PREFIX + uid)
            return
        node.hold(CLAIM_PREFIX + uid, allocs)
        node.take_mig(CLAIM_PREFIX + uid, tuple(taken))

    @staticmethod
    def _mig_taken(node: NodeState, node_name: str, index: int, profile_id: int, start: int) -> Taken:
        """A MIG device of a claim as (card, profile, start, size), by the profiles the node published."""
        if index >= len(node.ledger):
            raise LedgerError(f"node {node_name} has no gpu-{index}")
        card = node.mig.card(index) if node.mig is not None else None
        p = card.profile(profile_id) if card is not None else None
        if card is None or p is None:  # the agent's annotation is behind: the placement's size is not known here
            return (index, f"profile id {profile_id}", start, 1)
        if start not in p.starts:
            raise LedgerError(f"node {node_name}: gpu-{index} has no {p.name} placement at {start}")
        return (index, p.name, start, p.memory_slices)

    # -- MIG instances of the device plugins --------------------------------------------------------------
    def _set_mig_pod(self, uid: str, pod: Mapping[str, Any]) -> None:
        """Count (or stop counting) a bound pod's `<prefix>mig-<profile>` asks against its node."""
        try:
            asks = mig_asks(pod)
        except ValueError:
            asks = {}
        node = (pod.get("spec") or {}).get("nodeName")
        finished = ((pod.get("status") or {}).get("phase")) in FINISHED
        old = self._mig_pods.pop(uid, None)
        if old is not None:
            used = self._mig_used.get(old[0], {})
            for r, n in old[1].items():
                left = used.get(r, 0) - n
                if left > 0:
                    used[r] = left
                else:  # nothing held: no entry (a node and resource once used would otherwise stay for good)
                    used.pop(r, None)
            if not used:
                self._mig_used.pop(old[0], None)
        if asks and isinstance(node, str) and node and not finished:
            self._mig_pods[uid] = (node, asks)
            used = self._mig_used.setdefault(node, {})
            for r, n in asks.items():
                used[r] = used.get(r, 0) + n

    def mig_in_use(self) -> dict[str, dict[str, int]]:
        """The `<prefix>mig-<profile>` instances bound pods hold, per node and resource (a copy): a node or resource
        nobody holds has no entry."""
        return {node: dict(used) for node, used in self._mig_used.items()}

    def mig_reasons(self, asks: Mapping[str, int], uid: str, names: list[str]) -> list[str]:
        """Per node name, "" when it has the MIG instances `asks` wants free, else why not. Pod `uid`'s own
        holding (a pod scheduled again) does not count against it."""
        own = self._mig_pods.get(uid)
        out = []
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.shape is None:
                out.append(node.problem if node is not None else "the gpumgr extender does not know this node")
                continue
            used = self._mig_used.get(name, {})
            if own is not None and own[0] == name:
                used = {r: n - own[1].get(r, 0) for r, n in used.items()}
            taken = [t for held in node.mig_taken.values() for t in held]
            out.append(mig_reason(node.mig, asks, used, taken))
        return out

    # -- assumptions (bind) ---------------------------------------------------------------------------------
    def assume(self, uid: str, node: str, allocs: list[Allocation], predicate_time: str) -> None:
        """Count `allocs` on `node` for `uid` until its annotations with `predicate_time` are observed."""
        self._assumed[uid] = Assumption(node=node, allocations=tuple(allocs), time=predicate_time)
        self._reconcile(uid)

    def forget(self, uid: str, predicate_time: str) -> None:
        """A bind failed: drop its assumption, and ignore the annotations it wrote (`predicate_time`) until
        the pod is seen without them; the bind takes them back, but the watch may still deliver them."""
        a = self._assumed.get(uid)
        if a is not None and a.time == predicate_time:
            del self._assumed[uid]
        self._void[uid] = predicate_time
        self._reconcile(uid)

    def assumed(self, uid: str) -> Assumption | None:
        return self._assumed.get(uid)

    def _reconcile(self, uid: str) -> None:
        """Make the ledgers hold exactly what `uid` should hold (and where)."""
        node_name, allocs = None, None
        a = self._assumed.get(uid)
        claim = self._claims.get(uid)
        if claim is not None and claim.predicate_time == self._void.get(uid):
            claim = None
        if a is not None:
            node_name, allocs = a.node, list(a.allocations)
        elif claim is not None:
            node_name = claim.node
        before = self._wanted_at.pop(uid, None)
        if before is not None and before != node_name:
            uids = self._wanted[before]
            uids.discard(uid)
            if not uids:
                del self._wanted[before]
        if node_name is not None:
            self._wanted.setdefault(node_name, set()).add(uid)
            self._wanted_at[uid] = node_name
        was = self._applied.pop(uid, None)
        node = self.nodes.get(node_name) if node_name else None
        usable = node is not None and node.shape is not None
        if was is not None and was in self.nodes and (not usable or was != node_name):
            self.nodes[was].drop(uid)  # on the same node, hold() replaces it in place (it keeps its turn)
        if node is None or node.shape is None:
            return
        if allocs is None:
            assert claim is not None
            allocs = node.allocations(uid, claim)
        node.hold(uid, allocs)
        self._applied[uid] = node.name

    # -- fits -----------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Bring every node's card rows up to date: done once both lists are in, so that the first filter does
        not (a query refreshes the nodes it reads that changed since)."""
        for node in self.nodes.values():
            node.refresh()

    def verdict(self, ask: PodAsk, uid: str, name: str) -> Fit:
        """Whether the pod fits on node `name` now (its own holdings not counted); cards may be left out."""
        node = self.nodes.get(name)
        if node is not None and node.shape is not None and self._wanted_at.get(uid) == name and node.holds(uid):
            return self._place(node, node.shape, ask, node.without(uid))
        cache = self._cache(self._verdicts, ask.key)
        fit = cache.get(name)
        if fit is None:
            fit = self._placements.get(ask.key, {}).get(name)
        if fit is None:
            if node is None:  # never cached: the caches hold only nodes that exist
                return Fit.not_now(f"node {name} is not known to the gpumgr extender yet")
            if node.shape is None:
                fit = Fit.never(node.problem)
            else:
                fit = self._first(node, node.shape, ask, ask.whole_only and len(ask.containers) == 1)
        cache[name] = fit
        return fit

    def _first(self, node: NodeState, shape: Shape, ask: PodAsk, whole: bool) -> Fit:
        """The verdict of a node not cached for this ask: placed (with packing) where that is as cheap as the
        quick verdict, so that prioritize finds it cached too. `whole`: one container, of whole cards."""
        node.refresh()
        allowed, never = self._allowed(node, shape, ask)
        if never is not None:
            return never
        if whole:
            placed = self.classify(shape, ask, allowed, node)
        else:
            placed = fast_place(shape.topology, node.rows, node.shared, allowed, shape.unit_mib, ask, self.high_first)
        if placed is not None:
            return self.placed_fit(node, shape, ask, allowed, placed)
        if whole:
            memo_key = (shape.ident, node.whole_key, ask.key, allowed, "quick")
            fit = self._memo.get(memo_key)
            if fit is None:
                fit = quick_check(node.rows, allowed, shape.unit_mib, ask) or self._place(node, shape, ask)
                self._remember(memo_key, fit)
            return fit
        return quick_check(node.rows, allowed, shape.unit_mib, ask) or self._place(node, shape, ask)

    def classify(self, shape: Shape, ask: PodAsk, allowed: tuple[bool, ...],
                 node: NodeState) -> tuple[tuple[int, ...], ...] | None:
        """`fast_place` for a pod of one whole-card container: a function of the healthy free cards, so computed
        once per class of nodes."""
        key = (shape.ident, node.whole_key, ask.key, allowed)
        placed = self._classes.get(key, MISSING)
        if placed is MISSING:
            placed = fast_place(shape.topology, node.rows, node.shared, allowed, shape.unit_mib, ask, self.high_first)
            if len(self._classes) >= MAX_MEMO:
                del self._classes[next(iter(self._classes))]
            self._classes[key] = placed
        return placed  # type: ignore[no-any-return]

    def placed_fit(self, node: NodeState, shape: Shape, ask: PodAsk, allowed: tuple[bool, ...],
                   placed: tuple[tuple[int, ...], ...]) -> Fit:
        """The Fit of a placement made from the node's card rows (equal ones shared, not made again)."""
        p = packing(placed, node.rows, allowed, shape.unit_mib, ask, node.used_total if False not in allowed else None)
        multi = [c for c in placed if len(c) > 1]
        return Fit.placed_at(placed, max((shape.topology.worst(c) for c in multi), default=None), p)

    def placement(self, ask: PodAsk, uid: str, name: str) -> Fit:
        """`verdict` with the cards, worst link and packing when the pod fits (prioritize, bind)."""
        node = self.nodes.get(name)
        if node is not None and node.shape is not None and self._wanted_at.get(uid) == name and node.holds(uid):
            return self._place(node, node.shape, ask, node.without(uid))
        cache = self._cache(self._placements, ask.key)
        fit = cache.get(name)
        if fit is None:
            fit = self.verdict(ask, uid, name)
            if node is None:
                return fit
            if fit.ok and not fit.placed:
                assert node.shape is not None
                fit = self._place(node, node.shape, ask)
            cache[name] = fit
        return fit

    def cached_entries(self) -> int:
        """How many per-node verdicts and placements are cached (at most MAX_ASKS x the known nodes, twice)."""
        return sum(len(c) for table in (self._verdicts, self._placements) for c in table.values())

    def verdicts(self, ask: PodAsk, uid: str, names: list[str]) -> list[Fit]:
        """`verdict` for many nodes (the filter hot loop: one dict lookup per node when cached)."""
        return self._many(self._verdicts, self.verdict, ask, uid, names)

    def placements(self, ask: PodAsk, uid: str, names: list[str]) -> list[Fit]:
        """`placement` for many nodes (the prioritize hot loop)."""
        return self._many(self._placements, self.placement, ask, uid, names)

    def _many(self, table: dict[str, dict[str, Fit]], one: Callable[[PodAsk, str, str], Fit], ask: PodAsk,
              uid: str, names: list[str]) -> list[Fit]:
        cache = self._cache(table, ask.key)
        out: list[Fit | None] = [cache.get(n) for n in names]
        own = self._wanted_at.get(uid)
        if own is not None or None in out:
            if table is self._verdicts:
                self._fill(ask, names, out, cache, own)
            elif out.count(None) > REUSE_FROM:
                self._reuse(ask, names, out, cache, own)
            for i, n in enumerate(names):
                if out[i] is None or n == own:
                    out[i] = one(ask, uid, n)
        return out  # type: ignore[return-value]  # no None left

    def _fill(self, ask: PodAsk, names: list[str], out: list[Fit | None], cache: dict[str, Fit],
              own: str | None) -> None:
        """`verdict` for the known nodes not cached (but the pod's own node), in one loop: a new ask's first call
        visits every node."""
        nodes = self.nodes
        placed = self._cache(self._placements, ask.key)
        whole = ask.whole_only and len(ask.containers) == 1
        plans: dict[int, Plan | None] = {}
        for i, n in enumerate(names):
            if out[i] is not None or n == own:
                continue
            node = nodes.get(n)
            if node is None:
                continue
            fit = placed.get(n)
            if fit is None:
                shape = node.shape
                if shape is None:
                    fit = Fit.never(node.problem)
                else:
                    plan = plans.get(shape.ident, MISSING)
                    if plan is MISSING:
                        plan = plans[shape.ident] = self._plan(shape, ask)
                    if node.stale:
                        node.refresh()
                    fit = (plan.fit(node) if plan is not None and not node.cordon.cards else None) or self._first(
                        node, shape, ask, whole)
            out[i] = cache[n] = fit

    def _reuse(self, ask: PodAsk, names: list[str], out: list[Fit | None], cache: dict[str, Fit],
               own: str | None) -> None:
        """`placement` for the known nodes not cached (but the pod's own node) whose verdict is cached and needs no
        placing (placed, or not fitting), in one loop: prioritize after a new ask's first filter."""
        verdicts = self._verdicts.get(ask.key)
        if verdicts is None:
            return
        nodes = self.nodes
        for i, n in enumerate(names):
            if out[i] is None and n != own:
                fit = verdicts.get(n)
                if fit is not None and (fit.placed or not fit.ok) and n in nodes:
                    out[i] = cache[n] = fit

    def _plan(self, shape: Shape, ask: PodAsk) -> Plan | None:
        """A `Plan` for nodes of `shape` without a cordon, when the pod has one GPU container (or several, each a
        share, placed by `binpack` or `topology`) and no card choices."""
        if ask.choices.constrains or not ask.containers:
            return None
        if len(ask.containers) > 1 and (ask.choices.policy == "spread"
                                        or any(c.cores >= HUNDRED for c in ask.containers)):
            return None
        allowed, never = self._static(shape, ask)
        if never is not None:
            return None
        return Plan(shape, ask, allowed, self.classify, self._first, self.high_first)

    def _node_changed(self, name: str) -> None:
        for table in (self._verdicts, self._placements):
            for cache in table.values():
                cache.pop(name, None)

    @staticmethod
    def _cache(table: dict[str, dict[str, Fit]], key: str) -> dict[str, Fit]:
        cache = table.get(key)
        if cache is None:
            if len(table) >= MAX_ASKS:
                del table[next(iter(table))]
            cache = table[key] = {}
        return cache

    def _static(self, shape: Shape, ask: PodAsk) -> tuple[tuple[bool, ...], Fit | None]:
        key = (shape.ident, ask.key)
        found = self._statics.get(key)
        if found is None:
            if len(self._statics) >= MAX_MEMO:
                self._statics.clear()
            found = static_check(shape.models, shape.memory_mib, shape.unit_mib, ask)
            self._statics[key] = found
        return found

    def _allowed(self, node: NodeState, shape: Shape, ask: PodAsk) -> tuple[tuple[bool, ...], Fit | None]:
        """`_static`, narrowed by the pod's UUID choices and the node's cordon (per node, not per shape)."""
        allowed, never = self._static(shape, ask)
        if never is not None or (not ask.choices.constrains and not node.cordon.cards):
            return allowed, never
        mine = allowed_cards(node.gpus, ask.choices, node.cordon)
        mask = tuple(a and m for a, m in zip(allowed, mine.mask(len(allowed)), strict=True))
        if not mine.cards:
            return mask, Fit.never(mine.why_none())
        if not any(mask):
            return mask, Fit.never(f"{mine.describe()}, and none of them is of an accepted model")
        return mask, None

    def _place(self, node: NodeState, shape: Shape, ask: PodAsk, ledger: Ledger | None = None) -> Fit:
        allowed, never = self._allowed(node, shape, ask)
        if never is not None:
            return never
        if ledger is None:
            ledger, state = node.ledger, node.state(ask.whole_only)
        else:
            state = whole_state(ledger) if ask.whole_only else full_state(ledger)
        memo_key = (shape.ident, state, ask.key, allowed)
        fit = self._memo.get(memo_key)
        if fit is None:
            fit = place(shape.topology, ledger, allowed, shape.unit_mib, ask, self.high_first)
            self._remember(memo_key, fit)
        return with_packing(fit, ledger, allowed, shape.unit_mib, ask)

    def _remember(self, key: tuple[object, ...], fit: Fit) -> None:
        if len(self._memo) >= MAX_MEMO:
            del self._memo[next(iter(self._memo))]
        self._memo[key] = fit


@dataclass(frozen=True)
class DraClaim:
    namespace: str
    name: str
    per_node: dict[str, tuple[DriverResult, ...]]  # node (the result's pool) -> its results there


@dataclass(frozen=True)
class Assumption:
    node: str
    allocations: tuple[Allocation, ...]
    time: str  # the predicate-time the bind writes
