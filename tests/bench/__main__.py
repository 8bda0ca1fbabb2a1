"""`python -m tests.bench`: run every Python benchmark in this folder and print its figures.

Each bench prints a line when it starts and one when it ends; while it runs, a heartbeat line every
HEARTBEAT seconds says it is still running, so `make bench` is never silent for long.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

HEARTBEAT = 15.0


def main() -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    only = sys.argv[1:]
    chosen = [n for n in names if not only or any(o in n for o in only)]
    print(f"running {len(chosen)} benches: {', '.join(chosen)}", flush=True)
    for name in chosen:
        module = importlib.import_module(f"tests.bench.{name}")
        run_one(name, module.main)
    return 0


def run_one(name: str, bench: Callable[[], object], out: TextIO | None = None, every: float = HEARTBEAT) -> None:
    """Run one bench between a start and an end line, with a heartbeat line every `every` seconds."""
    stream = out or sys.stdout
    stream.write(f"\n===== {name} =====\n")
    stream.flush()
    t0 = time.perf_counter()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            stream.write(f"  ... {name} still running ({time.perf_counter() - t0:.0f} s)\n")
            stream.flush()

    ticker = threading.Thread(target=beat, name=f"heartbeat-{name}", daemon=True)
    ticker.start()
    try:
        bench()
    finally:
        stop.set()
        ticker.join()
    stream.write(f"({name}: {time.perf_counter() - t0:.1f} s)\n")
    stream.flush()


if __name__ == "__main__":
    sys.exit(main())
