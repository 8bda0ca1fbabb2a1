"""Per-pod card choices and per-card cordon: the annotations, read and checked, and the cards they leave.

Pod annotations (each optional; the HAMi key in brackets is accepted too, for clusters moving over):

    gpumgr.io/gpu-policy        binpack | spread | topology          [hami.io/gpu-scheduler-policy]
    gpumgr.io/gpu-uuid-select   UUID[,UUID...]: only these cards     [nvidia.com/use-gpuuuid]
    gpumgr.io/gpu-uuid-exclude  UUID[,UUID...]: never these cards    [nvidia.com/nouse-gpuuuid]

Node annotation `gpumgr.io/cordoned-gpus: UUID-or-index[,...]`: cards that take no new pods; pods already on
them keep running. Precedence for a new allocation: select narrows, then exclude removes (a card in both is
excluded), then cordon removes; what is left is `Allowed.cards`, and the evaluators only ever choose among
those (health and free room still apply).

A malformed pod annotation raises `ChoiceError` naming the annotation and the fix. A malformed cordon annotation
cannot be refused (nobody is asking), so it is *fail-closed*: every card counts as cordoned, and the error is
kept on the `Cordon` for status, metrics and the refusal message, until the annotation is fixed.
Pure functions and frozen data, no I/O; `CordonWatch` holds the latest cordon of one node for the agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpumgr.requests.podspec import ascii_uint, pod_annotations

ANN_POLICY = "gpumgr.io/gpu-policy"
ANN_UUID_SELECT = "gpumgr.io/gpu-uuid-select"
ANN_UUID_EXCLUDE = "gpumgr.io/gpu-uuid-exclude"
ANN_CORDON = "gpumgr.io/cordoned-gpus"  # on the Node
HAMI_POLICY = "hami.io/gpu-scheduler-policy"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"

Policy = Literal["binpack", "spread", "topology"]
POLICIES: tuple[Policy, ...] = ("binpack", "spread", "topology")
DEFAULT_POLICY: Policy = "binpack"
_POLICY_WORDS: dict[str, Policy] = {"binpack": "binpack", "spread": "spread", "topology": "topology",
                                    "topology-aware": "topology"}  # the last: HAMi's spelling

MAX_VALUE_CHARS = 4096  # one annotation value
MAX_ENTRIES = 64  # UUIDs or indices in one list
MAX_ENTRY_CHARS = 96  # one UUID (GPU-8-4-4-4-12 is 40; MIG UUIDs are longer)
_ENTRY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:")
_LIST_FIX = "a comma-separated list of GPU UUIDs such as GPU-4c2f0b1e-...; `nvidia-smi -L` prints them"
_CORDON_FIX = "a comma-separated list of GPU UUIDs or card indices (0, 1, ...); empty or removed: no cordon"


class ChoiceError(ValueError):
    """A pod's choice annotation cannot be read; the message names the annotation and the fix."""


class GPULike(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str: ...


# -- pod annotations -------------------------------------------------------------------------------------------
def pod_choices(annotations: Mapping[str, str]) -> Choices:
    """The pod's choices from its annotations (missing: no constraint). Raises ChoiceError."""
    policy_text = _one_of(annotations, ANN_POLICY, HAMI_POLICY)
    policy: Policy = DEFAULT_POLICY
    if policy_text is not None:
        key, text = policy_text
        found = _POLICY_WORDS.get(text.strip().lower())
        if found is None:
            raise ChoiceError(f"annotation {key}: {_shown(text)} is not a policy; use one of {', '.join(POLICIES)}")
        policy = found
    select = _uuid_list(annotations, ANN_UUID_SELECT, HAMI_USE_UUID, empty_ok=False)
    exclude = _uuid_list(annotations, ANN_UUID_EXCLUDE, HAMI_NOUSE_UUID, empty_ok=True)
    return Choices(policy=policy, policy_explicit=policy_text is not None, select=select,
                   exclude=exclude or frozenset())


def pod_choices_of(pod: Mapping[str, object]) -> Choices:
    """`pod_choices` of a pod's API JSON (metadata.annotations)."""
    ann = pod_annotations(pod)
    return pod_choices(ann) if ann else NO_CHOICES


def _one_of(annotations: Mapping[str, str], ours: str, theirs: str) -> tuple[str, str] | None:
    """(key, value) of our key or the HAMi one; both set and different is an error."""
    a, b = annotations.get(ours), annotations.get(theirs)
    for key, text in ((ours, a), (theirs, b)):
        if text is not None:
            _check_size(key, text)
    if a is not None and b is not None and a.strip().lower() != b.strip().lower():
        raise ChoiceError(f"annotations {ours} and {theirs} disagree ({_shown(a)} vs {_shown(b)}); keep one")
    if a is not None:
        return ours, a
    if b is not None:
        return theirs, b
    return None


def _uuid_list(annotations: Mapping[str, str], ours: str, theirs: str, empty_ok: bool) -> frozenset[str] | None:
    found = _one_of(annotations, ours, theirs)
    if found is None:
        return None
    key, text = found
    entries = frozenset(e.lower() for e in _entries(key, text, _LIST_FIX))
    if not entries and not empty_ok:
        raise ChoiceError(f"annotation {key} is empty, which would leave no card; remove it to allow any card, or "
                          f"give {_LIST_FIX}")
    return entries


def _entries(key: str, text: str, fix: str) -> list[str]:
    _check_size(key, text)
    parts = [p.strip() for p in text.split(",")]
    if parts == [""]:
        return []
    if len(parts) > MAX_ENTRIES:
        raise ChoiceError(f"annotation {key}: {len(parts)} entries, at most {MAX_ENTRIES}; give {fix}")
    for i, p in enumerate(parts):
        if not p:
            raise ChoiceError(f"annotation {key}: entry {i + 1} is empty; give {fix}")
        if len(p) > MAX_ENTRY_CHARS or not set(p) <= _ENTRY_CHARS:
            raise ChoiceError(f"annotation {key}: entry {i + 1} {_shown(p)} is not a GPU UUID; give {fix}")
    return parts


def _check_size(key: str, text: str) -> None:
    if not isinstance(text, str):
        raise ChoiceError(f"annotation {key} must be a string")
    if len(text) > MAX_VALUE_CHARS:
        raise ChoiceError(f"annotation {key} is {len(text)} characters long, at most {MAX_VALUE_CHARS}")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


# -- node cordon -----------------------------------------------------------------------------------------------
def node_cordon(annotations: Mapping[str, str], gpus: Sequence[GPULike]) -> Cordon:
    """The node's cordon. Never raises: a malformed annotation cordons every card and says why in `error`."""
    text = annotations.get(ANN_CORDON)
    if text is None:
        return NO_CORDON
    try:
        cards = resolve_cordon(text, gpus)
    except ChoiceError as e:
        return Cordon(cards=frozenset(g.index for g in gpus), text=str(text)[:MAX_VALUE_CHARS], error=str(e))
    return Cordon(cards=cards, text=text, error="")


def node_cordon_of(node: Mapping[str, object], gpus: Sequence[GPULike]) -> Cordon:
    """`node_cordon` of a Node's API JSON."""
    meta = node.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(ann, Mapping):
        return NO_CORDON
    return node_cordon({str(k): str(v) for k, v in ann.items()}, gpus)


def resolve_cordon(text: str, gpus: Sequence[GPULike]) -> frozenset[int]:
    """Card indices the cordon annotation names. Raises ChoiceError for a malformed entry, an index the node
    does not have, or a UUID that is not on this node (a typo would otherwise cordon nothing)."""
    by_uuid = {g.uuid.lower(): g.index for g in gpus}
    out: set[int] = set()
    for i, entry in enumerate(_entries(ANN_CORDON, text, _CORDON_FIX)):
        index = ascii_uint(entry, MAX_ENTRY_CHARS)
        if index is not None:
            if index >= len(gpus):
                raise ChoiceError(f"annotation {ANN_CORDON}: entry {i + 1} is card {index}, but the node has "
                                  f"{len(gpus)} card(s) (0..{len(gpus) - 1}); give {_CORDON_FIX}")
            out.add(index)
        elif entry.lower() in by_uuid:
            out.add(by_uuid[entry.lower()])
        else:
            raise ChoiceError(f"annotation {ANN_CORDON}: entry {i + 1} {_shown(entry)} is not a card of this node; "
                              f"give {_CORDON_FIX}")
    return frozenset(out)


class CordonWatch:
    """The latest cordon of one node, for the agent: `update(node)` with each fresh Node object; call the watch
    (or read `current`) for the cordon now. Keeps nothing else."""

    def __init__(self, gpus: Sequence[GPULike]):
        self._gpus = tuple(gpus)
        self.current = NO_CORDON

    def update(self, node: Mapping[str, object]) -> bool:
        """Take the cordon from a Node's API JSON; True when it changed."""
        new = node_cordon_of(node, self._gpus)
        changed = new != self.current
        self.current = new
        return changed

    def __call__(self) -> Cordon:
        return self.current


# -- what a new allocation may use -----------------------------------------------------------------------------
def allowed_cards(gpus: Sequence[GPULike], choices: Choices, cordon: Cordon) -> Allowed:
    """The cards a NEW allocation for this pod may use on this node: selected (or all), not excluded, not
    cordoned. Cards already held are not affected: a cordon never moves or stops a running pod."""
    uuid_of = {g.index: g.uuid.lower() for g in gpus}
    every = frozenset(uuid_of)
    selected = every if choices.select is None else frozenset(i for i, u in uuid_of.items() if u in choices.select)
    kept = frozenset(i for i in selected if uuid_of[i] not in choices.exclude)
    cards = kept - cordon.cards
    return Allowed(cards=cards, every=every, selected=selected, kept=kept, cordon=cordon)


@dataclass(frozen=True)
class Choices:
    policy: Policy = DEFAULT_POLICY
    policy_explicit: bool = False  # the pod named a policy (else the default)
    select: frozenset[str] | None = None  # lower-cased UUIDs; None: any card
    exclude: frozenset[str] = frozenset()  # lower-cased UUIDs

    @property
    def constrains(self) -> bool:
        """True when the pod narrows the cards (select or exclude)."""
        return self.select is not None or bool(self.exclude)


NO_CHOICES = Choices()


@dataclass(frozen=True)
class Cordon:
    cards: frozenset[int]  # indices that take no new pods
    text: str  # the annotation as found ("" when absent)
    error: str  # why the annotation was not understood ("" when it was); then `cards` is every card


NO_CORDON = Cordon(cards=frozenset(), text="", error="")


@dataclass(frozen=True)
class Allowed:
    cards: frozenset[int]  # what a new allocation may use
    every: frozenset[int]  # the node's cards
    selected: frozenset[int]  # after gpu-uuid-select
    kept: frozenset[int]  # after gpu-uuid-exclude
    cordon: Cordon

    @property
    def restricted(self) -> bool:
        return self.cards != self.every

    def mask(self, n: int) -> tuple[bool, ...]:
        """Per card index 0..n-1: may it be used (the shape the extender's `allowed` tuples have)."""
        return tuple(i in self.cards for i in range(n))

    def why_none(self) -> str:
        """Why no card is left (call when `cards` is empty): the first rule that removed the last card."""
        if not self.selected:
            return (f"none of the cards named in {ANN_UUID_SELECT} is on this node "
                    f"({len(self.every)} card(s) here)")
        if not self.kept:
            which = "every card of this node is" if self.selected == self.every else "every selected card is"
            return f"{which} excluded by {ANN_UUID_EXCLUDE}"
        if self.cordon.error:
            return f"the node's cards are all treated as cordoned: {self.cordon.error}"
        cordoned = ",".join(str(i) for i in sorted(self.kept & self.cordon.cards))
        what = "every card the pod may use is" if self.kept != self.every else "every card is"
        return (f"{what} cordoned by the node annotation {ANN_CORDON} (cards {cordoned}); pods already on them keep "
                "running, new pods go to other cards or nodes")

    def describe(self) -> str:
        """A short note for refusal messages when the cards were narrowed ("" when not)."""
        if not self.restricted:
            return ""
        left = ",".join(str(i) for i in sorted(self.cards)) or "none"
        why = []
        if self.selected != self.every:
            why.append(ANN_UUID_SELECT)
        if self.kept != self.selected:
            why.append(ANN_UUID_EXCLUDE)
        if self.kept - self.cards:
            why.append(f"cordon {ANN_CORDON}")
        return f"only cards {left} may be used ({', '.join(why)})"
