#!/usr/bin/env python3
"""make bench: the median cost libvcuda adds to a hooked cuMemAlloc_v2 and to a
hooked cuLaunchKernel under the compute limit, against calling the fake driver
directly in the same run. Prints figures; asserts nothing."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_compute  # noqa: E402
from harness import UUID_A, Fixture, GiB  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(HERE.parent / "build"))
    build = Path(ap.parse_args().build).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="vcuda-bench-", dir="/tmp"))
    try:
        fx = Fixture(build, tmp, "bench")
        node = fx.node([(UUID_A, 64 * GiB, 80)])
        c = fx.container()
        c.write_limits([(UUID_A, 32 * GiB)], core=50)
        env = c.env(node, FAKEGPU_BLOCK_NS="1")  # kernels of ~1 ns: far under the 50% limit
        print("libvcuda added cost (fake driver, LD_PRELOAD, memory limit 32 GiB, compute limit 50%):")
        p = subprocess.run([str(build / "vcbench")], env=env, cwd=tmp, text=True, timeout=120)
        if p.returncode != 0:
            return p.returncode

        def fixture(name: str) -> Fixture:
            d = tmp / name
            d.mkdir()
            return Fixture(build, d, name)

        bench_compute.run(fixture)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
