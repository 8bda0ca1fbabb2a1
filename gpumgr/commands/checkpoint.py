"""`gpumgr checkpoint show|verify PATH`: read a checkpoint without an agent, with the agent's own rules.

Both generations (the file and its `.prev`) are checked exactly as the agent checks them at start
(`CheckpointStore.examine`), and the output says which one the agent would load.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumgr.allocator import Ledger


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("checkpoint", help="show or verify a gpumgr checkpoint file")
    p.add_argument("action", choices=("show", "verify"))
    p.add_argument("path", help="checkpoint file (gpumgr_checkpoint.json) or its directory")
    p.add_argument("--node", default=None, metavar="NAME",
                   help="the node the checkpoint should belong to (a file written for another node is refused)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpumgr.node.checkpoint import FILE_NAME, CheckpointStore

    path = Path(args.path)
    # a directory, the current file or its `.prev`: either way both generations are read, as the agent reads them
    store = CheckpointStore(path) if path.is_dir() else CheckpointStore(path.parent, path.name.removesuffix(".prev"))
    gens = store.examine(args.node)
    if not gens:
        print(f"gpumgr checkpoint: {store.path}: no such file (nor {store.prev.name}); a directory holds "
              f"{FILE_NAME}", file=sys.stderr)
        return 2
    chosen = next((g for g in gens if g.snapshot is not None), None)
    if args.action == "verify":
        for g in gens:
            if g.snapshot is not None:
                s = g.snapshot
                print(f"{g.path}: ok (generation {s.generation}, {len(s.ledger.allocations)} allocations, "
                      f"node {s.node or '-'}, written {s.written_at or '-'})")
            else:
                print(f"{g.path}: BAD: {_reason(g.problem or '', g.path)}")
        first_bad = next((g.problem for g in gens if g.problem), None)
        if chosen is None or chosen.snapshot is None:
            print("the agent would load nothing: it would start from the kubelet checkpoint and the live pods")
            print(f"gpumgr checkpoint: {first_bad}", file=sys.stderr)
            return 1
        print(f"the agent would load {chosen.path} (generation {chosen.snapshot.generation})")
        if chosen.path == str(store.path):
            return 0
        print(f"gpumgr checkpoint: {first_bad or f'{store.path}: missing'}", file=sys.stderr)
        return 1
    for g in gens:
        if g is not chosen and g.snapshot is None:
            print(f"gpumgr checkpoint: skipped: {g.problem}", file=sys.stderr)
    if chosen is None or chosen.snapshot is None:
        print("gpumgr checkpoint: no usable checkpoint (see `gpumgr checkpoint verify` for each file)", file=sys.stderr)
        return 1
    snap = chosen.snapshot
    print(f"# {chosen.path}: generation {snap.generation}, node {snap.node or '-'}, written {snap.written_at or '-'}"
          " (the generation the agent would load)")
    print(render_ledger(snap.ledger))
    print("# health is not stored in a checkpoint: the agent learns it from the cards at start (`gpumgr status`)")
    if snap.ledger.allocations:
        print()
        print(json.dumps([a.to_json() for a in snap.ledger.allocations.values()], indent=1))
    return 0


def render_ledger(ledger: Ledger) -> str:
    """The card table with the columns of `gpumgr status`: what is USED and ALLOCATED on each card."""
    from gpumgr.topology.render import holder_name, table

    rows: list[tuple[str, ...]] = [("GPU", "MODE", "CORES USED", "MEMORY ALLOCATED", "HOLDERS")]
    for c in ledger.cards:
        holders = ", ".join(
            f"{holder_name(ledger, k)} ({h.cores}c/{h.memory_mib}MiB)" for k, h in sorted(c.holders.items())
        ) or "-"
        rows.append((str(c.index), c.mode, f"{100 - c.free_cores}/100",
                     f"{c.memory_mib - c.free_memory_mib}/{c.memory_mib} MiB", holders))
    return table(rows)


def _reason(problem: str, path: str) -> str:
    return problem.removeprefix(f"{path}: ")
