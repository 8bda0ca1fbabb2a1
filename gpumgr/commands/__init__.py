"""One module per `gpumgr` subcommand; each has `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib

COMMANDS = ("topo", "place", "checkpoint", "run", "extender", "demo", "status", "webhook")


def register_all(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gpumgr.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"gpumgr.commands.{name}":
                continue  # not built yet
            raise
        module.register(sub)
