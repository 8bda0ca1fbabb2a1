"""Node labels of MIG, named as NVIDIA's GPU Feature Discovery names them (strategy `mixed`), so selectors written
for NVIDIA's stack work: `nvidia.com/mig.capable`, `nvidia.com/mig.strategy`, and per profile of the static layout
`nvidia.com/mig-<profile>.{count,memory,multiprocessors,slices.gi,slices.ci,replicas,sharing-strategy}`; plus the
MIG manager's `nvidia.com/mig.config.state` (success / failed: the layout was applied, or something was refused).
Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpumgr.allocator.ledger import Ledger
from gpumgr.mig.layout import LABEL as CONFIG_LABEL
from gpumgr.mig.types import MigCard

PREFIX = "nvidia.com/"
_OWNED = re.compile(r"nvidia\.com/mig[.-]")


def mig_labels(cards: Iterable[MigCard], ledger: Ledger, refused: bool | None = None,
               shared: Mapping[str, int] | None = None) -> dict[str, str]:
    """`refused`: None when no layout was asked (no config.state label). `shared`: {profile: replicas} of the
    profiles served as shares: GPU Feature Discovery's `.replicas` and `.sharing-strategy` (`time-slicing`, the
    value its selectors know; gpumgr's shares also enforce memory) say so, `none` and 1 for the others."""
    shared = shared or {}
    cards = list(cards)
    out = {f"{PREFIX}mig.capable": "true" if cards else "false", f"{PREFIX}mig.strategy": "mixed"}
    if refused is not None:
        out[f"{PREFIX}mig.config.state"] = "failed" if refused else "success"
    profiles = {p.name: p for c in cards for p in c.profiles}
    counts: dict[str, int] = {}
    for s in ledger.slots.values():
        if s.origin != "claim" and s.ready:  # the device plugins' resources
            counts[s.profile] = counts.get(s.profile, 0) + 1
    for name, n in sorted(counts.items()):
        p = profiles.get(name)
        base = f"{PREFIX}mig-{name}"
        out[f"{base}.count"] = str(n)
        out[f"{base}.replicas"] = str(shared.get(name, 1))
        out[f"{base}.sharing-strategy"] = "time-slicing" if name in shared else "none"
        if p is not None:
            out[f"{base}.memory"] = str(p.memory_mib)
            out[f"{base}.multiprocessors"] = str(p.multiprocessors)
            out[f"{base}.slices.gi"] = str(p.slices)
            out[f"{base}.slices.ci"] = str(p.slices)  # one full-size compute instance
    return out


def owned(current: Mapping[str, str], wanted: Mapping[str, str]) -> set[str]:
    """The MIG labels the agent owns on the node (so that a stale one is removed): ours now or before, never the
    operator's `nvidia.com/mig.config`."""
    return {k for k in (*current, *wanted) if _OWNED.match(k) and k != CONFIG_LABEL}
