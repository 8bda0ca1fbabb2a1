"""`gpumgr demo`: run the whole system on a simulated node and show what it does."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="run everything on a simulated 8-GPU node (no GPU or cluster needed)")
    p.add_argument("--once", action="store_true", help="run the scripted pods and exit (default: stay up)")
    p.add_argument("--metrics-port", type=int, default=5678, help="port of the agent's /metric (default 5678)")
    p.add_argument("--nvml", action="store_true",
                   help="run the agent on the real NVML binding (nvidia-ml-py) over the fake libnvidia-ml.so.1 "
                        "built by `make fake-nvml`, instead of the simulated backend")
    p.add_argument("--nvml-lib", default="", help="the fake libnvidia-ml.so.1 for --nvml (default: the one "
                   "`make fake-nvml` builds in this checkout)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from gpumgr.files.docfile import InputError

    if not 0 <= args.metrics_port <= 65535:
        raise InputError(f"--metrics-port must be 0..65535, got {args.metrics_port}")
    nvml_lib = None
    if args.nvml:
        from gpumgr.devices.fake_nvml_node import library

        nvml_lib = Path(args.nvml_lib) if args.nvml_lib else library()
        if not nvml_lib.is_file():
            raise InputError(f"--nvml: {nvml_lib} is not built; run `make fake-nvml` in the source checkout first")
    elif args.nvml_lib:
        raise InputError("--nvml-lib needs --nvml")

    from gpumgr.demo import run_demo

    return asyncio.run(run_demo(args.once, args.metrics_port, nvml_lib=nvml_lib))
