"""`python -m tests.bench`: run every Python benchmark in this folder and print its figures."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main() -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    only = sys.argv[1:]
    for name in names:
        if only and not any(o in name for o in only):
            continue
        print(f"\n===== {name} =====", flush=True)
        t0 = time.perf_counter()
        module = importlib.import_module(f"tests.bench.{name}")
        module.main()
        print(f"({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
