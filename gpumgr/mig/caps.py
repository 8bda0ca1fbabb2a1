"""The capability device nodes of MIG instances: /proc/driver/nvidia-caps/mig-minors maps
`gpu<minor>/gi<G>/access` and `gpu<minor>/gi<G>/ci<C>/access` to minors M of /dev/nvidia-caps/nvidia-cap<M>. A
container using a MIG instance needs its parent's /dev/nvidia<minor> and both of these."""

from __future__ import annotations

import re
from pathlib import Path

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
CAPS_DIR = "/dev/nvidia-caps"
_LINE = re.compile(r"([a-z0-9/]{1,64}) ([0-9]{1,7})\Z")
_MAX_BYTES = 4 << 20  # 64 GPUs x 15 GIs x 9 lines is ~200 KiB


class CapsError(Exception):
    """The mig-minors file cannot be read or does not list an instance; the message names the file."""


def read_minors(path: Path = MIG_MINORS) -> dict[str, int]:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except OSError as e:
        raise CapsError(f"cannot read {path}: {e.strerror or e} (is the NVIDIA driver loaded with MIG support?)") \
            from None
    if len(data) > _MAX_BYTES:
        raise CapsError(f"{path}: larger than {_MAX_BYTES} bytes: not a mig-minors file")
    out: dict[str, int] = {}
    for n, raw in enumerate(data.decode("ascii", "replace").splitlines(), 1):
        m = _LINE.match(raw.strip())
        if not m:
            if raw.strip():
                raise CapsError(f"{path}, line {n}: not `<capability> <minor>`")
            continue
        out[m.group(1)] = int(m.group(2))
    return out


def instance_nodes(minors: dict[str, int], gpu_minor: int, gi: int, ci: int, source: Path = MIG_MINORS) \
        -> tuple[str, str]:
    """The GI and CI access nodes of one instance."""
    keys = (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access")
    missing = [k for k in keys if k not in minors]
    if missing:
        raise CapsError(f"{source} lists no {missing[0]}")
    return f"{CAPS_DIR}/nvidia-cap{minors[keys[0]]}", f"{CAPS_DIR}/nvidia-cap{minors[keys[1]]}"
