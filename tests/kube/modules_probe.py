"""`python -m tests.kube.modules_probe run ...`: `gpumgr run ...` that, when it ends, writes the modules of the
heavy packages the device-plugin agent should not need (`kubernetes`, `networkx`) it had imported to the file named
by env MODULES_OUT (one per line)."""

from __future__ import annotations

import os
import sys

from gpumgr.cli import main

if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    finally:
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "networkx"))
        with open(os.environ["MODULES_OUT"], "w") as f:
            f.write("".join(f"{m}\n" for m in loaded))
    sys.exit(code)
