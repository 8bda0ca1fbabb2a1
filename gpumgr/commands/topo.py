"""`gpumgr topo`: the GPUs, their pairwise link levels and the topology tree."""

from __future__ import annotations

import argparse
import json

from gpumgr.commands.common import add_node_source, load_inventory


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("topo", help="show a node's GPUs, link levels and topology tree")
    add_node_source(p)
    p.add_argument("--format", choices=("tree", "json"), default="tree")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumgr.allocator import Ledger
    from gpumgr.topology.cost import Topology
    from gpumgr.topology.render import LEVEL_LEGEND, render_levels, render_tree

    inv = load_inventory(args)
    topo = Topology.of(inv)
    if args.format == "json":
        doc = {
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "minor": g.minor, "name": g.name,
                 "memory_mib": g.memory_mib, "numa_node": g.numa_node}
                for g in inv.gpus
            ],
            "levels": [list(r) for r in topo.levels],
            "tree": topo.tree.to_json(),
        }
        print(json.dumps(doc, indent=1))
    else:
        ledger = Ledger(g.memory_mib for g in inv.gpus)
        print(render_tree(topo, ledger, inv))
        print()
        print("Link levels:")
        print(render_levels(topo))
        print(f"Levels {LEVEL_LEGEND}.")
    return 0
