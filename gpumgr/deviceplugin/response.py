"""What a container gets from Allocate: device nodes, environment, read-only mounts, annotations, CDI names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpumgr.devices.types import GPU
from gpumgr.pb import deviceplugin_pb2 as pb

CONTAINER_DRIVER_DIR = "/usr/local/nvidia/lib64"
CONTAINER_SHIM_DIR = "/usr/local/gpumgr"
CONTAINER_VDEVICE_DIR = "/etc/vcuda"
SHIM_LIB = "libvcuda.so"
ANN_MEMORY = "tencent.com/vcuda-memory"  # container annotation: bytes of card memory, when known


@dataclass(frozen=True)
class ResponseConfig:
    dev_root: Path = Path("/dev")
    driver_dir: str = "/etc/gpu-manager/vdriver/driver"  # the staged NVIDIA libraries (vdriver.py)
    shim_dir: str = "/etc/gpu-manager/vdriver"
    cdi: bool = False
    cdi_kind: str = "nvidia.com/gpu"
    shim_log_level: int = 2


def build(cfg: ResponseConfig, gpus: list[GPU], cores: int, memory_bytes: int, vdevice_dir: Path,
          allocation_key: str) -> pb.ContainerAllocateResponse:
    fractional = cores < 100
    resp = pb.ContainerAllocateResponse()
    for g in gpus:
        resp.devices.append(pb.DeviceSpec(container_path=f"/dev/nvidia{g.minor}", host_path=f"/dev/nvidia{g.minor}",
                                          permissions="rw"))
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        if name == "nvidiactl" or (cfg.dev_root / name).exists():
            resp.devices.append(pb.DeviceSpec(container_path=f"/dev/{name}", host_path=f"/dev/{name}",
                                              permissions="rw"))
    resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in gpus)
    libs = [CONTAINER_DRIVER_DIR]
    resp.mounts.append(pb.Mount(container_path=CONTAINER_DRIVER_DIR, host_path=cfg.driver_dir, read_only=True))
    resp.mounts.append(pb.Mount(container_path=CONTAINER_VDEVICE_DIR, host_path=str(vdevice_dir), read_only=True))
    if fractional:
        libs.insert(0, f"{CONTAINER_SHIM_DIR}/lib64")
        resp.mounts.append(pb.Mount(container_path=CONTAINER_SHIM_DIR, host_path=cfg.shim_dir, read_only=True))
        resp.envs["LD_PRELOAD"] = f"{CONTAINER_SHIM_DIR}/lib64/{SHIM_LIB}"
        resp.envs["VCUDA_SOCKET"] = f"{CONTAINER_VDEVICE_DIR}/vcuda.sock"
        resp.envs["VCUDA_LIMITS"] = f"{CONTAINER_VDEVICE_DIR}/limits"
        resp.envs["VCUDA_REAL_CUDA"] = f"{CONTAINER_DRIVER_DIR}/libcuda.so.1"
        resp.envs["VCUDA_REAL_NVML"] = f"{CONTAINER_DRIVER_DIR}/libnvidia-ml.so.1"
        resp.envs["VCUDA_LOG_LEVEL"] = str(cfg.shim_log_level)
    resp.envs["LD_LIBRARY_PATH"] = ":".join(libs)
    resp.annotations["tencent.com/vcuda-core"] = str(cores)
    resp.annotations[ANN_MEMORY] = str(memory_bytes)
    resp.annotations["tencent.com/vcuda-device"] = ",".join(f"/dev/nvidia{g.minor}" for g in gpus)
    resp.annotations["gpumgr.io/allocation"] = allocation_key
    if cfg.cdi:
        for g in gpus:
            resp.cdi_devices.append(pb.CDIDevice(name=f"{cfg.cdi_kind}={g.uuid}"))
    return resp
