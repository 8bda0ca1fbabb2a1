"""Random admission scenarios on a simulated node, and the invariants checked after each.

One case: a random set of pods (same and different core counts, memory from one unit to near a card, whole cards,
init containers), created in the API in one order, optionally with the card an extender would have recorded, then
admitted by the kubelet emulator in another order (creation order, shuffled, largest memory first), each
container's resources core-first, memory-first or either; by a kubelet that follows GetPreferredAllocation, or
(some cases) one that never asks it and takes the sorted free set; containers start (PreStartContainer) right
after their pod's admission, or after a batch of admissions, in any order. A pod whose admission the agent refuses
as unsafe is recreated by its "owner" (a new pod, queued again); a pod that fits nowhere is failed and deleted.

Invariants: every pod that fits the node when the kubelet admits it starts (at most RETRIES recreations; with a
kubelet that ignores the preferred cards, a pod may instead be refused at Allocate, never started wrongly); no
limit, annotation or ledger entry belongs to another pod; the ledger equals the kubelet checkpoint; no card is
over-committed. Used by tests/admission/test_property.py (a few dozen cases) and tests/bench/bench_admission.py
(many more).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumgr.agent.reconcile import reconcile
from gpumgr.allocator import Allocation, InvalidRequest, Ledger, LedgerError, NoFit, Request, choose
from gpumgr.deviceplugin import ids as devids
from gpumgr.node import binding
from gpumgr.node.kubelet_checkpoint import read_kubelet_checkpoint
from gpumgr.requests import podspec
from gpumgr.sim.kubelet import AdmissionError, AdmittedPod
from gpumgr.sim.node import SimNode
from gpumgr.vdevice.layout import allocation_key
from gpumgr.vdevice.limits import Limits

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY
RETRIES = 3
POD_ORDERS = ("creation", "shuffled", "largest-memory-first")
RESOURCE_ORDERS = ("core-first", "memory-first", "either")
NO_PREFERENCE_SHARE = 0.15  # cases whose kubelet never asks GetPreferredAllocation (takes the sorted free set)
START_MODES = ("at-once", "batch")  # PreStart right after each admission, or after a batch of admissions


def make_case(seed: int, cards: int, card_units: int) -> Case:
    rnd = random.Random(seed)
    n = rnd.randint(3, 8)
    same_cores = rnd.random() < 0.5
    shared_cores = rnd.choice([10, 20, 30, 50])
    pods = []
    for i in range(n):
        if rnd.random() < 0.12:
            app = (100 * rnd.choice([1, 1, 2]) if cards > 1 else 100, 0)
        else:
            cores = shared_cores if same_cores else rnd.choice([5, 10, 20, 30, 40, 50, 70])
            units = rnd.choice([1, 2, rnd.randint(1, card_units - 1), card_units - 1, card_units // 2])
            app = (cores, units)
        init = None
        if app[0] < 100 and rnd.random() < 0.2:
            init = (rnd.randint(1, app[0]), rnd.randint(1, app[1]))
        pods.append(PodPlan(f"s{seed}-p{i}", app, init))
    return Case(seed=seed, pods=pods, records=rnd.random() < 0.5, pod_order=rnd.choice(POD_ORDERS),
                resource_order=rnd.choice(RESOURCE_ORDERS), start=rnd.choice(START_MODES),
                preferred=rnd.random() >= NO_PREFERENCE_SHARE, rnd=rnd)


async def run_case(node: SimNode, case: Case, totals: Totals) -> None:
    """Create, admit, start, check, then delete every pod of the case (the node is empty again afterwards)."""
    unit = node.agent.state.memory_unit_mib if node.agent and node.agent.state else 256
    node.kubelet.use_preferred = case.preferred
    queue = [_create(node, case, p, retry=0) for p in _with_records(node, case)]
    await _seen(node, queue)
    order = list(range(len(queue)))
    if case.pod_order == "shuffled":
        case.rnd.shuffle(order)
    elif case.pod_order == "largest-memory-first":
        order.sort(key=lambda i: -queue[i].plan.app[1])
    pending = [queue[i] for i in order]
    running: list[Live] = []  # admitted (started or not)
    while pending:
        size = 1 if case.start == "at-once" else case.rnd.randint(1, 4)
        batch, pending = pending[:size], pending[size:]
        admitted: list[Live] = []
        for live in batch:
            live.fits = _fits(node, live.plan, running, unit)
            resource_order = {"core-first": "sorted", "memory-first": "reverse"}.get(
                case.resource_order, case.rnd.choice(["sorted", "reverse"]))
            totals.admissions += 1
            try:
                live.admitted = await node.admit(live.pod, resource_order,  # type: ignore[arg-type]
                                                 start=case.start == "at-once")
            except AdmissionError as e:
                pending += await _failed(node, case, live, e, totals)
                continue
            running.append(live)
            admitted.append(live)
        if case.start == "batch":  # the containers start later, in any order, after the batch was admitted
            case.rnd.shuffle(admitted)
            for live in admitted:
                assert live.admitted is not None
                try:
                    await node.start_pod(live.pod, live.admitted)
                except AdmissionError as e:
                    running.remove(live)
                    pending += await _failed(node, case, live, e, totals)
        totals.started += sum(1 for live in admitted if live in running)
    assert node.agent is not None and node.agent.service is not None
    await reconcile(node.agent.service, True, 60.0, "admissions done")  # as on the pod changes just made
    problems = await check_invariants(node, running)
    totals.violations += len(problems)
    totals.violation_lines += [f"seed {case.seed}: {p}" for p in problems]
    for live in running:
        await node.delete_pod(live.name)
    await reconcile(node.agent.service, True, 60.0, "case done")  # what the pod watch would do a moment later
    totals.cases += 1


async def _failed(node: SimNode, case: Case, live: Live, e: AdmissionError, totals: Totals) -> list[Live]:
    """The kubelet rejected the pod or could not start it: it is failed and deleted; its owner recreates it when
    the agent refused it as unsafe. Returns the pods to queue again."""
    if node.api.store.get_pod("default", live.name) is not None:
        node.api.store.set_pod_phase("default", live.name, "Failed")
    await node.delete_pod(live.name)
    unsafe = "refusing rather than starting a pod that could not fit" in e.message
    totals.refusals += unsafe
    if unsafe:
        totals.refusal_lines.append(f"seed {case.seed}: {live.name} {live.plan}")
        totals.refusals_following += case.preferred  # the kubelet took the preferred cards: should not happen
    if not live.fits or e.reason.startswith("OutOf"):  # the kubelet's own count of free devices said no
        totals.unfit += 1
        return []
    if unsafe and live.retry < RETRIES:
        again = _create(node, case, live.plan, retry=live.retry + 1)
        await _seen(node, [again])
        return [again]
    if not case.preferred and "PreStartContainer" not in e.message:
        # a kubelet that ignores the agent's preferred cards may never offer cards where the pod can go; refused
        # at Allocate, it never ran with a wrong share (counted, not a stranded pod)
        totals.misplaced += 1
        return []
    totals.stranded += 1
    totals.stranded_cases.append(f"seed {case.seed}: {live.name} {live.plan}: {e.message[:300]}")
    return []


async def check_invariants(node: SimNode, running: list[Live]) -> list[str]:
    assert node.agent is not None and node.agent.service is not None
    state = node.agent.state
    assert state is not None
    unit = state.memory_unit_mib
    out: list[str] = []
    ckpt = read_kubelet_checkpoint(node.kubelet.checkpoint_path)
    by_uid = {str(live.pod["metadata"]["uid"]): live for live in running}
    entries = [e for e in ckpt.entries if e.resource_name == CORE and e.pod_uid in by_uid]
    holders: dict[str, list[tuple[str, str]]] = {}
    for e in entries:
        holders.setdefault(allocation_key(e.device_ids), []).append((e.pod_uid, e.container_name))
    ledger = {k: a for k, a in state.ledger.allocations.items() if not k.startswith("dra/")}
    if set(ledger) != set(holders):
        out.append(f"ledger keys differ from the kubelet checkpoint: extra {sorted(set(ledger) - set(holders))}, "
                   f"missing {sorted(set(holders) - set(ledger))}")
    for key, listed in holders.items():
        a = ledger.get(key)
        if a is None:
            continue
        uid, cname = binding.app_owner(listed, by_uid[listed[0][0]].pod)
        if (a.pod_uid, a.container) != (uid, cname):
            out.append(f"{key}: ledger says {a.pod}/{a.container}, kubelet {uid}/{cname}")
        if not a.verified:
            out.append(f"{key}: not verified after PreStart")
        ask = binding.find_container(by_uid[uid].pod, cname)
        if ask is not None and a.reserve and ask.cores < 100:
            mine = ask.memory_units * unit
            riders = [r.memory_mib for r in ledger.values() if r.rides_on == key]
            if a.memory_mib != max([mine, *riders]):
                out.append(f"{key}: reserves {a.memory_mib} MiB, its container asks {mine} (riders {riders})")
    out += _card_totals(node, state.ledger)
    for live in running:
        assert live.admitted is not None
        out += _container_checks(node, live, unit)
    return out


def _card_totals(node: SimNode, ledger: Ledger) -> list[str]:
    out = []
    for c in ledger.cards:
        cores = sum(h.cores for h in c.holders.values())
        mem = sum(h.memory_mib for h in c.holders.values())
        if cores > 100 or mem > c.memory_mib:
            out.append(f"card {c.index} over-committed: {cores} cores, {mem} of {c.memory_mib} MiB")
    return out


def _container_checks(node: SimNode, live: Live, unit: int) -> list[str]:
    out = []
    assert live.admitted is not None
    uid = str(live.pod["metadata"]["uid"])
    for ask in podspec.gpu_containers(live.pod, include_init=True):
        got = live.admitted.container(ask.name)
        resp = got.responses[CORE]
        ann = dict(resp.annotations)
        own = ask.memory_units * unit if ask.cores < 100 else sum(
            node.inventory.gpus[c].memory_mib for c in devids.cards_of(node.inventory, got.device_ids[CORE], "c"))
        if "tencent.com/vcuda-memory" in ann and ann["tencent.com/vcuda-memory"] != str(own << 20):
            out.append(f"{live.name}/{ask.name}: vcuda-memory annotation {ann['tencent.com/vcuda-memory']}, "
                       f"its own is {own << 20}")
        if ask.init:
            continue  # init containers have finished; their limits were checked when they ran
        vdir = Path({m.container_path: m.host_path for m in resp.mounts}["/etc/vcuda"])
        try:
            limits = Limits.parse((vdir / "limits").read_text())
        except OSError as e:
            out.append(f"{live.name}/{ask.name}: no limits file: {e}")
            continue
        if (limits.pod_uid, limits.container_name) != (uid, ask.name):
            out.append(f"{live.name}/{ask.name}: limits of {limits.pod_uid}/{limits.container_name}")
        want_mem = (ask.memory_units * unit) << 20 if ask.cores < 100 else 0
        if limits.core_limit != (ask.cores if ask.cores < 100 else 0) or \
                any(d.memory_limit_bytes != want_mem for d in limits.devices):
            out.append(f"{live.name}/{ask.name}: limits {limits.core_limit} cores "
                       f"{[d.memory_limit_bytes for d in limits.devices]} bytes, asks {ask.cores} / {want_mem}")
    return out


def _fits(node: SimNode, plan: PodPlan, running: Iterable[Live], unit: int) -> bool:
    """Whether the pod fits the node as it truly is now (what the running pods' containers ask, on the cards the
    kubelet gave them)."""
    truth = Ledger(g.memory_mib for g in node.inventory.gpus)
    for live in running:
        assert live.admitted is not None
        need = live.plan.app if live.plan.init is None else (
            max(live.plan.app[0], live.plan.init[0]), max(live.plan.app[1], live.plan.init[1]))
        ids = live.admitted.container("main").device_ids[CORE]
        cards = tuple(sorted(devids.cards_of(node.inventory, ids, "c")))
        try:
            truth.assign(Allocation(str(live.pod["metadata"]["uid"]), cards, need[0],
                                    need[1] * unit if need[0] < 100 else 0))
        except LedgerError:  # admitted where it cannot run: until its start fails, the kubelet counts its cores
            with contextlib.suppress(LedgerError):
                truth.assign(Allocation(str(live.pod["metadata"]["uid"]), cards, need[0], 0))
    for i, reasons in (node.agent.state.health_reasons.items() if node.agent and node.agent.state else []):
        truth.set_healthy(i, not reasons)
    need = plan.app if plan.init is None else (max(plan.app[0], plan.init[0]), max(plan.app[1], plan.init[1]))
    try:
        choose(node.agent.state.topology if node.agent and node.agent.state else None,  # type: ignore[arg-type]
               truth, Request(need[0], need[1] * unit if need[0] < 100 else 0))
    except (InvalidRequest, NoFit):
        return False
    return True


def _with_records(node: SimNode, case: Case) -> list[tuple[PodPlan, int | None]]:
    """What an extender would have recorded: a card where the pod fits, given the pods recorded before it."""
    if not case.records:
        return [(p, None) for p in case.pods]
    assert node.agent is not None and node.agent.state is not None
    shadow = node.agent.state.ledger.copy()
    unit = node.agent.state.memory_unit_mib
    out: list[tuple[PodPlan, int | None]] = []
    for p in case.pods:
        card = None
        if p.app[0] < 100:
            need = (max(p.app[0], p.init[0]), max(p.app[1], p.init[1])) if p.init else p.app
            try:
                card = choose(node.agent.state.topology, shadow, Request(need[0], need[1] * unit)).cards[0]
                shadow.assign(Allocation(p.name, (card,), need[0], need[1] * unit))
            except (InvalidRequest, NoFit):
                card = None
        out.append((p, card))
    return out


def _create(node: SimNode, case: Case, plan_or_pair: Any, retry: int) -> Live:
    plan, card = plan_or_pair if isinstance(plan_or_pair, tuple) else (plan_or_pair, None)
    name = plan.name if retry == 0 else f"{plan.name}-r{retry}"
    ann = {}
    if card is not None:
        ann[f"{podspec.ANN_PREDICATE_IDX}0"] = str(node.inventory.gpus[card].minor)
    init = [("init", *plan.init)] if plan.init else []
    pod = node.create_pod(name, [("main", *plan.app)], annotations=ann, init_containers=init)
    return Live(name=name, plan=plan, pod=pod, retry=retry)


async def _seen(node: SimNode, lives: list[Live]) -> None:
    assert node.agent is not None and node.agent.service is not None
    svc = node.agent.service
    for _ in range(1000):
        if all(svc.pods.get(live.pod["metadata"]["uid"]) for live in lives):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the agent never saw the pods")


@dataclass
class PodPlan:
    name: str
    app: tuple[int, int]  # (vcuda-core, vcuda-memory units) of container "main"
    init: tuple[int, int] | None = None  # of init container "init"


@dataclass
class Case:
    seed: int
    pods: list[PodPlan]
    records: bool
    pod_order: str
    resource_order: str
    start: str
    preferred: bool
    rnd: random.Random


@dataclass
class Live:
    name: str
    plan: PodPlan
    pod: dict[str, Any]
    retry: int
    admitted: AdmittedPod | None = None
    fits: bool = True  # whether it fitted the node when the kubelet admitted it


@dataclass
class Totals:
    cases: int = 0
    admissions: int = 0
    started: int = 0
    unfit: int = 0
    refusals: int = 0
    refusals_following: int = 0  # of those, by a kubelet that followed the preferred cards
    misplaced: int = 0
    stranded: int = 0
    violations: int = 0
    stranded_cases: list[str] = field(default_factory=list)
    violation_lines: list[str] = field(default_factory=list)
    refusal_lines: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.cases} cases, {self.admissions} admissions: {self.started} started, {self.unfit} did not "
                f"fit the node, {self.refusals} refused as unsafe and recreated ({self.refusals_following} of them "
                f"with a kubelet following the preferred cards), {self.misplaced} never offered a card "
                f"that fits by a kubelet without preferences, {self.stranded} stranded, "
                f"{self.violations} invariant violations")
