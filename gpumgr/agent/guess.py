"""Guesses that cannot strand a pod: which cards to offer, and what to reserve, when Allocate cannot tell which of
several pending pods the kubelet is admitting.

The kubelet may admit any pending pod that asks the same vcuda-core count (its admission order is its own). A
guess is *safe* when every such pod that fits anywhere on the node now would also fit on the chosen cards: then
whichever it is, PreStartContainer finds room for it. Until the kubelet names the owner, the allocation reserves
the largest memory of those pods, so nothing admitted in between can take the room the real owner needs.
Pure functions of (topology, ledger, candidates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpumgr.allocator import Allocation, InvalidRequest, Ledger, NoFit, Request, choose
from gpumgr.devices.types import GPU
from gpumgr.node.binding import Candidate
from gpumgr.requests import podspec
from gpumgr.requests.choices import (
    DEFAULT_POLICY,
    NO_CHOICES,
    NO_CORDON,
    ChoiceError,
    Cordon,
    Policy,
    allowed_cards,
    pod_choices_of,
)
from gpumgr.topology.cost import Topology


def memory_of(cand: Candidate, unit_mib: int) -> int:
    """MiB the candidate takes on its card (0 for whole cards: they take the card)."""
    return 0 if cand.ask.cores >= 100 else cand.ask.memory_units * unit_mib


def need_of(cand: Candidate, unit_mib: int) -> tuple[int, int]:
    """(cores, MiB) the card must have room for. An init container's share is handed on to its pod's app
    containers with shares (the kubelet reuses its devices, so they land on its card): its card must hold the
    largest of them."""
    if cand.ask.cores >= 100 or not cand.ask.init:
        return cand.ask.cores, memory_of(cand, unit_mib)
    shares = [a for a in podspec.gpu_containers(cand.pod, include_init=True) if a.cores < 100]
    return max(a.cores for a in shares), max(a.memory_units for a in shares) * unit_mib


def fits_on(ledger: Ledger, cand: Candidate, cards: tuple[int, ...], unit_mib: int) -> bool:
    cores, memory = need_of(cand, unit_mib)
    probe = Allocation(key="\x00probe", cards=tuple(sorted(cards)), cores=cores, memory_mib=memory)
    return ledger.problem(probe) is None


def fits_somewhere(topo: Topology, ledger: Ledger, cand: Candidate, unit_mib: int,
                   allowed: frozenset[int] | None = None) -> bool:
    if cand.ask.cores < 100:
        return any(fits_on(ledger, cand, (c.index,), unit_mib) for c in ledger.cards
                   if allowed is None or c.index in allowed)
    try:
        choose(topo, ledger, Request(cand.ask.cores, 0), allowed)
    except (InvalidRequest, NoFit):
        return False
    return True


def plan(topo: Topology, ledger: Ledger, cands: Sequence[Candidate], unit_mib: int,
         gpus: Sequence[GPU] = (), cordon: Cordon = NO_CORDON) -> Plan:
    """Cards to offer for the next container asking these candidates' core count. The extender's recorded cards
    come first (oldest decision first) when every possible candidate fits there; else the evaluators' choice for
    the candidate needing the most memory (same cores: where it fits, all the smaller ones fit too), among the
    cards every candidate may use (its gpu-uuid choices, the node's cordon), in the first candidate's policy."""
    allowed = {c.uid: _allowed(gpus, c, cordon) for c in cands}
    possible = [c for c in cands if fits_somewhere(topo, ledger, c, unit_mib, allowed[c.uid])]
    if not possible:
        return Plan(None, ())
    for c in possible:
        if c.recorded and all(fits_on(ledger, o, c.recorded, unit_mib) for o in possible):
            return Plan(c.recorded, tuple(possible))
    cores = max(need_of(c, unit_mib)[0] for c in possible)
    memory = max(need_of(c, unit_mib)[1] for c in possible)
    common: frozenset[int] | None = None
    for c in possible:
        mine = allowed[c.uid]
        if mine is not None:
            common = mine if common is None else common & mine
    try:
        cards = choose(topo, ledger, Request(cores if cores < 100 else possible[0].ask.cores, memory), common,
                       _policy(possible[0])).cards
    except (InvalidRequest, NoFit):
        return Plan(None, tuple(possible))
    return Plan(tuple(sorted(cards)), tuple(possible))


def judge(topo: Topology, ledger: Ledger, cands: Sequence[Candidate], cards: tuple[int, ...],
          unit_mib: int) -> Verdict:
    """For the cards the kubelet chose: the candidates that fit there, and those that fit elsewhere but not
    there (the kubelet may be admitting one of them: then any answer strands it)."""
    here: list[Candidate] = []
    elsewhere: list[Candidate] = []
    nowhere = 0
    for c in cands:
        if fits_on(ledger, c, cards, unit_mib):
            here.append(c)
        elif fits_somewhere(topo, ledger, c, unit_mib):
            elsewhere.append(c)
        else:
            nowhere += 1
    return Verdict(tuple(here), tuple(elsewhere), nowhere)


def _allowed(gpus: Sequence[GPU], cand: Candidate, cordon: Cordon) -> frozenset[int] | None:
    """The cards a new allocation for the candidate may use; None: any card (or the node's cards not given)."""
    try:
        choices = pod_choices_of(cand.pod)
    except ChoiceError:
        choices = NO_CHOICES  # the extender refuses such pods; the kubelet's own choice stands
    if not gpus or (not choices.constrains and not cordon.cards):
        return None
    return allowed_cards(gpus, choices, cordon).cards


def _policy(cand: Candidate) -> Policy:
    try:
        return pod_choices_of(cand.pod).policy
    except ChoiceError:
        return DEFAULT_POLICY


@dataclass(frozen=True)
class Plan:
    cards: tuple[int, ...] | None
    possible: tuple[Candidate, ...]


@dataclass(frozen=True)
class Verdict:
    here: tuple[Candidate, ...]  # fit on the chosen cards
    stranded_if_chosen: tuple[Candidate, ...]  # fit on the node, not on the chosen cards
    fit_nowhere: int = 0  # candidates that fit on no card now (the kubelet admitting one of them: it cannot run)

    @property
    def safe(self) -> bool:
        return bool(self.here) and not self.stranded_if_chosen

    def reserve_mib(self, unit_mib: int) -> int:
        return max((memory_of(c, unit_mib) for c in self.here), default=0)

    def certain_memory_mib(self, unit_mib: int) -> int | None:
        """The memory of the container being admitted when every possible candidate asks the same, else None."""
        values = {memory_of(c, unit_mib) for c in self.here}
        return values.pop() if len(values) == 1 else None
