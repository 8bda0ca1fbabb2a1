"""Whether a node can serve a pod's MIG instances (`nvidia.com/mig-<profile>` through the device plugins), and if
not, why: which profile is short, and for each MIG card why no placement of it is free.

A node serves the static instances its agent publishes (gpumgr/node/mig_inventory.py); the pods bound there that ask
the same resource hold them. DRA claims on MIG devices (`taken`) hold placements the agent may not have made yet.
kube-scheduler counts the node's allocatable `nvidia.com/mig-*` itself as well: this check adds the reasons, and
keeps a node whose agent publishes fewer instances (a layout refused, an instance unhealthy) out early.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpumgr.extender.nodestate import Taken
from gpumgr.node.mig_inventory import MigCardView, MigProfileView, NodeMig
from gpumgr.requests.mig_ask import profile_of


def mig_reason(nm: NodeMig | None, asks: Mapping[str, int], used: Mapping[str, int],
               taken: Iterable[Taken] = ()) -> str:
    """"" when the node has the instances `asks` wants free, else why not (every short profile named)."""
    if nm is None or not nm.cards:
        return f"the node has no MIG-enabled card (asked {_asked(asks)})"
    taken = list(taken)
    why = []
    for resource, n in sorted(asks.items()):
        profile = profile_of(resource, nm.prefix)
        if profile is None:
            why.append(f"{resource}: the node serves MIG instances as {nm.prefix}<profile>")
            continue
        have = nm.static_count(profile)
        free = max(0, have - used.get(resource, 0))
        if free >= n:
            continue
        if have:
            why.append(f"{resource}: {n} asked, {free} of the node's {have} {profile} instances free")
        else:
            why.append(f"{resource}: the node's layout has no {profile} instance")
        why.extend(placements(nm, profile, taken))
    return "; ".join(why)


def placements(nm: NodeMig, profile: str, taken: list[Taken]) -> list[str]:
    """Per MIG card, where a new `profile` instance could go, or why it cannot."""
    out = []
    for card in nm.cards:
        p = card.profile(profile)
        if p is None:
            out.append(f"card {card.index} has no profile {profile}")
            continue
        mine = [(name, start, size) for c, name, start, size in taken if c == card.index]
        starts = card.free_starts(p, mine)
        if starts:
            out.append(f"card {card.index}: {profile} placements {_list(starts)} are free "
                       "(a layout or a DRA claim can make one there)")
        else:
            out.append(f"card {card.index}: no free {profile} placement ({blocked(card, p, mine)})")
    return out


def blocked(card: MigCardView, p: MigProfileView, taken: list[tuple[str, int, int]]) -> str:
    used = [(i.profile, i.start, i.size) for i in card.instances] + [t for t in taken]
    slices = sum(q.slices for name, _s, _n in used if (q := card.profile(name)) is not None)
    if slices + p.slices > card.compute_slices:
        return f"{card.compute_slices - slices} of {card.compute_slices} compute slices left, {p.slices} needed"
    if sum(1 for name, _s, _n in used if name == p.name) >= p.max_count:
        return f"at most {p.max_count} {p.name} per card"
    held = ", ".join(f"{name} at memory slices {start}-{start + size - 1}" for name, start, size in sorted(
        used, key=lambda u: u[1]))
    return f"placements {_list(p.starts)} overlap {held}"


def _asked(asks: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {r}" for r, n in sorted(asks.items()))


def _list(starts: Iterable[int]) -> str:
    return ",".join(str(s) for s in starts)
