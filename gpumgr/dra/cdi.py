"""CDI specs of prepared claims: one file per claim in the dynamic CDI directory, written atomically.

    <cdi dir>/gpumgr.io-vgpu_<claim uid>.json   (written whole to a temp file, then renamed)
    kind gpumgr.io/vgpu; one device per granted GPU, named claim-<uid>-gpu-<index>; the claim's common edits
    (control devices, driver libraries, the shim, the vDevice directory, env) at spec level.

`cdiVersion` is the lowest that covers the fields used: 0.5.0 once a device node carries `hostPath`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from gpumgr.dra.config import CDI_KIND
from gpumgr.files.write import write_new

CONTAINER_DRIVER_DIR = "/usr/local/nvidia/lib64"
CONTAINER_SHIM_DIR = "/usr/local/gpumgr"
CONTAINER_VDEVICE_DIR = "/etc/vcuda"
SHIM_LIB = "libvcuda.so"
RO = ["ro", "nosuid", "nodev", "bind"]
_FILE = re.compile(r"^gpumgr\.io-vgpu_([0-9a-zA-Z][0-9a-zA-Z-]{0,62})\.json$")


def ctl_devices(dev_root: Path) -> list[str]:
    """The control nodes a container of the driver's gets: /dev/nvidiactl, and the UVM nodes the host has (stats:
    call it off the event loop)."""
    return [f"/dev/{n}" for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
            if n == "nvidiactl" or (dev_root / n).exists()]


def device_name(claim_uid: str, index: int) -> str:
    return f"claim-{claim_uid}-gpu-{index}"


def qualified(name: str) -> str:
    return f"{CDI_KIND}={name}"


def file_name(claim_uid: str) -> str:
    return f"{CDI_KIND.replace('/', '-')}_{claim_uid}.json"


def build_spec(*, claim_uid: str, gpus: list[tuple[int, int, str]], ctl_devices: list[str], driver_dir: str,
               shim_dir: str, vdevice_dir: Path, limited: bool, shim_log_level: int,
               annotations: dict[str, str]) -> dict[str, Any]:
    """`gpus`: (index, minor, uuid) of each granted card. `limited`: the shim enforces a memory or core limit."""
    devices = [{"name": device_name(claim_uid, index),
                "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}", "hostPath": f"/dev/nvidia{minor}",
                                                    "permissions": "rw"}]}}
               for index, minor, _ in gpus]
    env = [f"NVIDIA_VISIBLE_DEVICES={','.join(u for _, _, u in gpus)}"]
    libs = [CONTAINER_DRIVER_DIR]
    mounts: list[dict[str, Any]] = [
        {"hostPath": driver_dir, "containerPath": CONTAINER_DRIVER_DIR, "options": list(RO)},
        {"hostPath": str(vdevice_dir), "containerPath": CONTAINER_VDEVICE_DIR, "options": list(RO)},
    ]
    if limited:
        libs.insert(0, f"{CONTAINER_SHIM_DIR}/lib64")
        mounts.append({"hostPath": shim_dir, "containerPath": CONTAINER_SHIM_DIR, "options": list(RO)})
        env += [f"LD_PRELOAD={CONTAINER_SHIM_DIR}/lib64/{SHIM_LIB}",
                f"VCUDA_SOCKET={CONTAINER_VDEVICE_DIR}/vcuda.sock",
                f"VCUDA_LIMITS={CONTAINER_VDEVICE_DIR}/limits",
                f"VCUDA_REAL_CUDA={CONTAINER_DRIVER_DIR}/libcuda.so.1",
                f"VCUDA_REAL_NVML={CONTAINER_DRIVER_DIR}/libnvidia-ml.so.1",
                f"VCUDA_LOG_LEVEL={shim_log_level}"]
    env.append(f"LD_LIBRARY_PATH={':'.join(libs)}")
    spec: dict[str, Any] = {
        "kind": CDI_KIND,
        "devices": devices,
        "containerEdits": {
            "env": env,
            "deviceNodes": [{"path": p, "hostPath": p, "permissions": "rw"} for p in ctl_devices],
            "mounts": mounts,
        },
    }
    if annotations:
        spec["annotations"] = dict(annotations)
    spec = {"cdiVersion": minimum_version(spec), **spec}
    return spec


def minimum_version(spec: dict[str, Any]) -> str:
    """The lowest CDI version whose schema has every field `spec` uses (of the ones this module writes)."""
    version = (0, 3, 0)
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    if any(n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []):
        version = max(version, (0, 5, 0))
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        version = max(version, (0, 4, 0))
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices") or []):
        version = max(version, (0, 6, 0))
    if any(e.get("additionalGids") or e.get("intelRdt") for e in edits):
        version = max(version, (0, 7, 0))
    return ".".join(map(str, version))


class CdiDir:
    def __init__(self, root: Path):
        self.root = Path(root)

    def path_for(self, claim_uid: str) -> Path:
        return self.root / file_name(claim_uid)

    def write(self, claim_uid: str, spec: dict[str, Any]) -> Path:
        """Atomically: every byte to a temp file, then renamed over the spec, so a runtime never reads half a spec.
        On any failure (a short write on a full disk, an I/O error) the temp file is removed, the previous spec
        stays as it was, and the OSError is raised. Not fsynced: the dynamic CDI directory (/var/run/cdi) is on
        tmpfs, emptied at boot, and the agent's recovery writes the spec of every held claim again (the checkpoint is
        what must survive a crash). Unchanged content is not rewritten."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(claim_uid)
        data = (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
        try:  # compared only at the same size: a stray huge file there is never read
            if path.stat().st_size == len(data) and path.read_bytes() == data:
                return path
        except OSError:
            pass
        tmp = self.root / f".{path.name}.tmp"
        write_new(tmp, data, 0o644, fsync=False)
        try:
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def remove(self, claim_uid: str) -> bool:
        try:
            self.path_for(claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True

    def claim_uids(self) -> list[str]:
        """UIDs of the claims that have a spec here (leftover temp files are removed)."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if p.name.startswith(".gpumgr.io-vgpu_") and p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)
                continue
            m = _FILE.match(p.name)
            if m:
                out.append(m.group(1))
        return sorted(out)

