"""Text renderings of a node for people: the topology tree with free capacity, the level matrix, and the card
table (what is USED on each card, as `gpumgr status` counts it)."""

from __future__ import annotations

from gpumgr.allocator import Ledger
from gpumgr.devices.types import Inventory
from gpumgr.topology.cost import Topology, TreeNode


def render_tree(topo: Topology, ledger: Ledger, inv: Inventory | None = None,
                cordoned: frozenset[int] | None = None) -> str:
    """The tree with free capacity per group; `cordoned` cards (no new pods) are marked CORDONED."""
    lines: list[str] = []

    def free_of(gpus: tuple[int, ...]) -> str:
        cards = [ledger.cards[g] for g in gpus]
        whole = sum(1 for c in cards if c.healthy and c.mode == "free")
        cores = sum(c.free_cores for c in cards if c.healthy and c.mode != "exclusive")
        mem = sum(c.free_memory_mib for c in cards if c.healthy and c.mode != "exclusive")
        return f"free: {whole}/{len(cards)} whole, {cores} cores, {mem} MiB"

    def leaf(g: int) -> str:
        c = ledger.cards[g]
        name = f" {inv.gpus[g].name}" if inv else ""
        health = ("" if c.healthy else ", UNHEALTHY") + (", CORDONED" if cordoned and g in cordoned else "")
        names = sorted(holder_name(ledger, k) for k in c.holders)
        holders = f", holders: {', '.join(names)}" if c.holders else ""
        return (f"GPU{g}{name} ({c.mode}, cores {c.free_cores}/100, memory {c.free_memory_mib}/"
                f"{c.memory_mib} MiB{health}{holders})")

    def walk(node: TreeNode, prefix: str, last: bool, top: bool) -> None:
        text = leaf(node.gpus[0]) if node.level == "GPU" else f"{node.level} ({free_of(node.gpus)})"
        if top:
            lines.append(text)
            child_prefix = ""
        else:
            lines.append(f"{prefix}{'`--' if last else '|--'} {text}")
            child_prefix = prefix + ("    " if last else "|   ")
        for i, c in enumerate(node.children):
            walk(c, child_prefix, i == len(node.children) - 1, False)

    walk(topo.tree, "", True, True)
    return "\n".join(lines)


def render_levels(topo: Topology) -> str:
    """The pairwise link levels as `nvidia-smi topo -m` lays them out, with each GPU's NUMA node when known."""
    with_numa = any(n is not None for n in topo.numa)
    head = ("", *(f"GPU{j}" for j in range(topo.n)), *(("NUMA",) if with_numa else ()))
    rows: list[tuple[str, ...]] = [head]
    for i in range(topo.n):
        numa = ("-" if topo.numa[i] is None else str(topo.numa[i]),) if with_numa else ()
        rows.append((f"GPU{i}", *topo.levels[i], *numa))
    return table(rows)


LEVEL_LEGEND = ("best to worst: NV# (# bonded NVLinks, more is better), PIX (one PCIe switch), PXB (several "
                "switches), PHB (a host bridge), NODE (host bridges of one NUMA node), SYS (across sockets)")


def holder_name(ledger: Ledger, key: str) -> str:
    """`namespace/pod/container` of an allocation when known (with `?` while unverified), `claim namespace/name`
    for a DRA claim's holding, else its key."""
    alloc = ledger.allocations.get(key)
    if alloc is None:
        return key
    if alloc.claim is not None:  # a DRA claim's holding: the claim is the holder (its pods share it)
        return f"claim {alloc.claim.namespace}/{alloc.claim.name}"
    if not alloc.pod:
        return key
    mark = "" if alloc.verified else "?"
    return f"{alloc.namespace or 'default'}/{alloc.pod}/{alloc.container}{mark}"


def render_cards(ledger: Ledger, inv: Inventory | None = None) -> str:
    rows: list[tuple[str, ...]] = [("GPU", "MODEL", "MODE", "HEALTH", "CORES USED", "MEMORY ALLOCATED", "HOLDERS")]
    for c in ledger.cards:
        holders = ", ".join(
            f"{holder_name(ledger, k)} ({h.cores}c/{h.memory_mib}MiB)" for k, h in sorted(c.holders.items())
        ) or "-"
        rows.append((
            str(c.index), inv.gpus[c.index].name if inv else "-", c.mode,
            "ok" if c.healthy else "UNHEALTHY", f"{100 - c.free_cores}/100",
            f"{c.memory_mib - c.free_memory_mib}/{c.memory_mib} MiB", holders,
        ))
    return table(rows)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)
