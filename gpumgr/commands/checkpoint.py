"""`gpumgr checkpoint show|verify PATH`: read a checkpoint file without an agent."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("checkpoint", help="show or verify a gpumgr checkpoint file")
    p.add_argument("action", choices=("show", "verify"))
    p.add_argument("path", help="checkpoint file (gpumgr_checkpoint.json) or its directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpumgr.checkpoint import FILE_NAME, CheckpointError, decode

    path = Path(args.path)
    if path.is_dir():
        path = path / FILE_NAME
    try:
        snap = decode(path.read_bytes(), str(path))
    except OSError as e:
        print(f"gpumgr checkpoint: {path}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"gpumgr checkpoint: {e}", file=sys.stderr)
        return 1
    if args.action == "verify":
        print(f"{path}: ok (generation {snap.generation}, {len(snap.ledger.allocations)} allocations, "
              f"written {snap.written_at})")
        return 0
    from gpumgr.render import render_cards

    print(f"# {path}: generation {snap.generation}, node {snap.node or '-'}, written {snap.written_at}")
    print(render_cards(snap.ledger))
    if args.action == "show" and snap.ledger.allocations:
        print()
        print(json.dumps([a.to_json() for a in snap.ledger.allocations.values()], indent=1))
    return 0
