"""Text renderings of a node for people: the topology tree with free capacity, and the card table."""

from __future__ import annotations

from gpumgr.allocator import Ledger
from gpumgr.devices.types import Inventory
from gpumgr.topology import Topology, TreeNode


def render_tree(topo: Topology, ledger: Ledger, inv: Inventory | None = None) -> str:
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
        health = "" if c.healthy else ", UNHEALTHY"
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


def holder_name(ledger: Ledger, key: str) -> str:
    """`namespace/pod/container` of an allocation when known (with `?` while unverified), else its key."""
    alloc = ledger.allocations.get(key)
    meta = alloc.meta if alloc else {}
    if not meta.get("pod"):
        return key
    mark = "" if meta.get("verified") == "true" else "?"
    return f"{meta.get('namespace', 'default')}/{meta['pod']}/{meta.get('container', '')}{mark}"


def render_cards(ledger: Ledger, inv: Inventory | None = None) -> str:
    rows: list[tuple[str, ...]] = [("GPU", "MODEL", "MODE", "HEALTH", "FREE CORES", "FREE MEMORY", "HOLDERS")]
    for c in ledger.cards:
        holders = ", ".join(
            f"{holder_name(ledger, k)} ({h.cores}c/{h.memory_mib}MiB)" for k, h in sorted(c.holders.items())
        ) or "-"
        rows.append((
            str(c.index), inv.gpus[c.index].name if inv else "-", c.mode,
            "ok" if c.healthy else "UNHEALTHY", f"{c.free_cores}/100",
            f"{c.free_memory_mib}/{c.memory_mib} MiB", holders,
        ))
    return table(rows)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)
