"""Options and loaders shared by several commands."""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING

from gpumgr.devices.types import Inventory
from gpumgr.files.docfile import InputError
from gpumgr.requests.podspec import ascii_uint

if TYPE_CHECKING:
    import asyncio

LOG_LEVELS = ("debug", "info", "warning", "error")


def env_default(flag: str, default: str | None) -> str | None:
    """`--device-plugin-dir` → env GPUMGR_DEVICE_PLUGIN_DIR, falling back to `default`."""
    return os.environ.get("GPUMGR_" + flag.lstrip("-").upper().replace("-", "_"), default)


def env_flag(flag: str) -> bool:
    """A store_true flag's default from its environment variable: 1, true, yes or on (any case)."""
    return str(env_default(flag, "") or "").strip().lower() in ("1", "true", "yes", "on")


_SECONDS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?")
MIN_SECONDS = 0.01  # a timeout below 10 ms only fails every call


def whole_flag(flag: str, text: object, low: int, high: int) -> int:
    """A flag's whole number (plain ASCII digits) from `low` to `high`; InputError naming the flag otherwise."""
    t = str(text).strip()
    value = ascii_uint(t, 12)
    if value is None or not low <= value <= high:
        raise InputError(f"{flag} {t[:40]!r}: expected a whole number from {low} to {high}")
    return value


MIN_MEMORY_LIMIT = 32 * 1024 * 1024  # no gpumgr service starts in less
MAX_MEMORY_LIMIT = 10**12 - 1  # what twelve digits write (~931 GiB)
MEMORY_LIMIT_HELP = ("the container's memory limit in bytes (0: not known); request bodies in flight are then "
                     "held to 3/8 of it, less the peak of the body being decoded. The chart sets it from "
                     "resources.limits.memory (the downward API)")


def memory_limit_flag(text: object) -> int:
    """--memory-limit-bytes: 0, or from MIN_MEMORY_LIMIT to MAX_MEMORY_LIMIT; InputError naming the flag."""
    value = whole_flag("--memory-limit-bytes", text, 0, MAX_MEMORY_LIMIT)
    if 0 < value < MIN_MEMORY_LIMIT:
        raise InputError(f"--memory-limit-bytes {value}: expected 0 (not known) or at least {MIN_MEMORY_LIMIT} "
                         "(32 MiB)")
    return value


def seconds_flag(flag: str, text: object, high: float, low: float = MIN_SECONDS) -> float:
    """A flag's seconds (digits, an optional decimal part: no exponent, sign, nan or inf), from `low` (by default
    MIN_SECONDS) to `high`; InputError naming the flag otherwise."""
    t = str(text).strip()
    value = float(t) if _SECONDS.fullmatch(t) else None
    if value is None or not low <= value <= high:
        raise InputError(f"{flag} {t[:40]!r}: timeouts must be positive and finite seconds, from {low:g} to {high:g} "
                         "(digits and an optional decimal part)" if low > 0 else
                         f"{flag} {t[:40]!r}: expected seconds from {low:g} to {high:g} (digits and an optional "
                         "decimal part)")
    return value


def check_log_level(level: str) -> None:
    if str(level).lower() not in LOG_LEVELS:
        raise InputError(f"--log-level {level!r}: expected one of {', '.join(LOG_LEVELS)}")


def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `[v6]:PORT` → (host, port); raises InputError naming the flag."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise InputError(f"{flag} {text!r}: expected HOST:PORT with a port from 1 to 65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT; call it inside the running loop of a serving command."""
    import asyncio
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def whole_number(text: str) -> int:
    """An argparse type: ASCII digits only (int() alone would also take "١٦٣٨٤")."""
    t = text.strip()
    if not (t.isascii() and t.lstrip("-").isdigit()) or len(t) > 18:
        raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}")
    return int(t)


def add_node_source(p: argparse.ArgumentParser, gpu_memory: bool = True) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--topo-file", metavar="F", help="text of `nvidia-smi topo -m`")
    src.add_argument("--node-spec", metavar="F", help="node spec (YAML or JSON) of a simulated node")
    if gpu_memory:
        p.add_argument("--gpu-memory-mib", type=whole_number, default=None, metavar="MIB",
                       help="memory per GPU with --topo-file (a topo -m text has none; assumed 16384)")
        p.add_argument("--gpu-model", default=None, metavar="NAME",
                       help="GPU model with --topo-file (a topo -m text has none; assumed 'unknown model (assumed)')")


def load_inventory(args: argparse.Namespace) -> Inventory:
    import sys

    from gpumgr.devices.spec import ASSUMED_MODEL, DEFAULT_MEMORY_MIB, inventory_from_topo_file, load_node_spec

    if args.topo_file:
        mem = getattr(args, "gpu_memory_mib", None)
        model = getattr(args, "gpu_model", None)
        if mem is not None and mem <= 0:
            raise InputError(f"--gpu-memory-mib must be positive, got {mem}")
        if model is not None and (not model.strip() or len(model) > 256 or not model.isprintable()):
            raise InputError(f"--gpu-model must be 1 to 256 printable characters, got {model[:40]!r}")
        inv = inventory_from_topo_file(args.topo_file, memory_mib=mem or DEFAULT_MEMORY_MIB,
                                       model=model or ASSUMED_MODEL)
        if mem is None or model is None:
            print(f"gpumgr {args.command}: note: {args.topo_file} names no GPU model or memory; assuming "
                  f"{model or ASSUMED_MODEL!r} with {mem or DEFAULT_MEMORY_MIB} MiB per card "
                  "(--gpu-model, --gpu-memory-mib)", file=sys.stderr)
        return inv
    return load_node_spec(args.node_spec)
