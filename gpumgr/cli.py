"""The `gpumgr` command. Heavy imports stay inside the commands that need them, so `topo` and `place` start fast."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_INPUT, EXIT_RUNTIME, EXIT_DISCOVERY = 0, 2, 1, 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "info")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from gpumgr.devices.types import DiscoveryError
    from gpumgr.files.docfile import InputError

    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"gpumgr {args.command}: {e}", file=sys.stderr)
        return EXIT_INPUT
    except DiscoveryError as e:
        logging.getLogger("gpumgr").error("GPU discovery failed: %s", e)
        return EXIT_DISCOVERY
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def build_parser() -> argparse.ArgumentParser:
    from gpumgr.commands import register_all

    p = argparse.ArgumentParser(prog="gpumgr", description="Fractional vGPU manager for Kubernetes")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_all(sub)
    return p


def _version() -> str:
    from gpumgr import __version__

    return f"gpumgr {__version__}"


if __name__ == "__main__":
    sys.exit(main())
