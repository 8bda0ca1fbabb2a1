"""Everything `gpumgr run` can be told (flags and GPUMGR_* environment)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    kubeconfig: str = ""  # empty: in-cluster
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    vdevice_root: Path = Path("/etc/gpu-manager/vm")
    checkpoint_dir: Path = Path("/etc/gpu-manager/checkpoint")
    memory_unit_mib: int = 256
    simulate: str = ""  # node spec file: use the simulated backend
    driver_root: str = "/usr/lib/x86_64-linux-gnu"
    shim_dir: str = "/etc/gpu-manager/vdriver"
    shim_source: str = "/usr/local/lib/gpumgr/libvcuda.so"
    nvml_lib: str = ""  # explicit libnvidia-ml.so.1 for the agent itself (e.g. /host/usr/lib/.../libnvidia-ml.so.1)
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    metrics_addr: str = "0.0.0.0:5678"
    check_period_s: float = 30.0
    grace_s: float = 60.0
    health_ignore_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    temp_unhealthy_c: int = 95
    temp_healthy_c: int = 90
    label_prefix: str = "gpumgr.io/"
    cdi: bool = False
    mig_layout: str = ""  # a MIG layout name (gpumgr/mig/layout.py); the node label nvidia.com/mig.config wins
    mig_layouts_file: str = ""  # JSON of configured layouts
    mig_prefix: str = "nvidia.com/mig-"  # resource name prefix of the MIG device plugins
    mig_shared: tuple[tuple[str, int], ...] = ()  # (profile, replicas): served as <prefix><profile>.shared
    mig_minors: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def kubelet_checkpoint(self) -> Path:
        return self.device_plugin_dir / "kubelet_internal_checkpoint"
