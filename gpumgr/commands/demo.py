"""`gpumgr demo`: run the whole system on a simulated node and show what it does."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="run everything on a simulated 8-GPU node (no GPU or cluster needed)")
    p.add_argument("--once", action="store_true", help="run the scripted pods and exit (default: stay up)")
    p.add_argument("--metrics-port", type=int, default=5678, help="port of the agent's /metric (default 5678)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpumgr.demo import run_demo

    return asyncio.run(run_demo(args.once, args.metrics_port))
