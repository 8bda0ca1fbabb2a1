"""Options and loaders shared by several commands."""

from __future__ import annotations

import argparse
import os

from gpumgr.devices.types import Inventory
from gpumgr.docfile import InputError


def env_default(flag: str, default: str | None) -> str | None:
    """`--device-plugin-dir` → env GPUMGR_DEVICE_PLUGIN_DIR, falling back to `default`."""
    return os.environ.get("GPUMGR_" + flag.lstrip("-").upper().replace("-", "_"), default)


def add_node_source(p: argparse.ArgumentParser, gpu_memory: bool = True) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--topo-file", metavar="F", help="text of `nvidia-smi topo -m`")
    src.add_argument("--node-spec", metavar="F", help="node spec (YAML or JSON) of a simulated node")
    if gpu_memory:
        p.add_argument("--gpu-memory-mib", type=int, default=16384, metavar="MIB",
                       help="memory per GPU with --topo-file (default 16384)")


def load_inventory(args: argparse.Namespace) -> Inventory:
    from gpumgr.devices.spec import inventory_from_topo_file, load_node_spec

    if args.topo_file:
        mem = getattr(args, "gpu_memory_mib", 16384)
        if mem <= 0:
            raise InputError(f"--gpu-memory-mib must be positive, got {mem}")
        return inventory_from_topo_file(args.topo_file, memory_mib=mem)
    return load_node_spec(args.node_spec)
