"""Prioritize: scores 0..10 for the nodes a pod fits on.

Topology first: for a pod with multi-card containers, the distinct worst links of the fitting nodes' best sets
form tiers, and each better tier gets a higher, disjoint band of scores. Inside a band, packing decides:
`binpack` (default) scores fuller cards and nodes higher (`Fit.packing`), `spread` the emptier ones.
Nodes the pod does not fit score 0. The same fits always give the same scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from gpumgr.extender.fit import Fit

POLICIES = ("binpack", "spread")
MAX_SCORE = 10  # MaxExtenderPriority


def scores(fits: Sequence[Fit], policy: str) -> list[int]:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
    spread = policy == "spread"
    # thousands of fits per call: when none has a worst link (one card per container), no tier is looked for
    worsts = set(map(attrgetter("worst"), fits))
    tiers = sorted({f.worst for f in fits if f.ok and f.worst is not None}) if worsts != {None} and worsts else []
    if not tiers:
        if spread:
            return [MAX_SCORE - f.points if f.ok else 0 for f in fits]
        return list(map(attrgetter("points"), fits))
    width = (MAX_SCORE + 1) / len(tiers)
    bands = {}
    for t, key in enumerate(tiers):  # t = 0 is the best link: the top band
        lo = int((len(tiers) - 1 - t) * width)
        bands[key] = (lo, max(lo, int((len(tiers) - t) * width) - 1))
    out = []
    for f in fits:
        if not f.ok or f.worst is None:
            out.append(0)
            continue
        lo, hi = bands[f.worst]
        pack = 1.0 - f.packing if spread else f.packing
        out.append(lo + round(pack * (hi - lo)))
    return out
