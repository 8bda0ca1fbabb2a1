"""Link levels between two GPUs, as `nvidia-smi topo -m` names them, and their order.

Best to worst: NV# (more bonded NVLinks is better), PIX, PXB, PHB, NODE, SYS. Old drivers print SOC for SYS.
A level's *key* orders them (smaller is better); its *cost* is a positive number for summing over pairs.
"""

from __future__ import annotations

import re

PCIE_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
ALIASES = {"SOC": "SYS", "CPU": "NODE"}
_NV = re.compile(r"NV([0-9]{1,3})")

LevelKey = tuple[int, int]


def normalize(level: str) -> str:
    """Canonical spelling of a level (SOC→SYS); raises ValueError for anything unknown."""
    text = level.strip().upper()
    text = ALIASES.get(text, text)
    if text in PCIE_RANK:
        return text
    m = _NV.fullmatch(text)
    if m and int(m.group(1)) > 0:
        return f"NV{int(m.group(1))}"
    raise ValueError(f"unknown link level {level!r} (expected NV#, PIX, PXB, PHB, NODE, SYS or SOC)")


def is_level(text: str) -> bool:
    try:
        normalize(text)
    except ValueError:
        return False
    return True


def key(level: str) -> LevelKey:
    """Sort key, smaller is better: every NV# beats every PCIe level, more links beat fewer."""
    m = _NV.fullmatch(level)
    if m:
        return (0, -int(m.group(1)))
    return (PCIE_RANK[level], 0)


def name(k: LevelKey) -> str:
    if k[0] == 0:
        return f"NV{-k[1]}"
    for level, rank in PCIE_RANK.items():
        if rank == k[0]:
            return level
    raise ValueError(f"no level has key {k}")


def cost(level: str) -> float:
    """Cost of one pair: PIX 10 … SYS 50; NV# below 10, shrinking with the number of links."""
    m = _NV.fullmatch(level)
    if m:
        return 8.0 / int(m.group(1))
    return 10.0 * PCIE_RANK[level]

