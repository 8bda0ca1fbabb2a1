"""What the DRA front end is told (`gpumgr run --mode dra|both` and the `--dra-*`, `--cdi-dir` flags)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumgr.agent.config import AgentConfig

DRIVER_NAME = "vgpu.gpumgr.io"
CDI_KIND = "gpumgr.io/vgpu"
MODES = ("device-plugin", "dra", "both")
DRA_SOCKET = "dra.sock"
UNHEALTHY_TAINT = "vgpu.gpumgr.io/unhealthy"
PLUGIN_SERVICES = ("v1.DRAPlugin",)


_DRIVER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")


def driver_name_problem(name: str) -> str | None:
    """Why `name` cannot be a DRA driver name (a DNS subdomain of at most 63 characters, with a dot), or None.
    The one rule for the agent's and the extender's --dra-driver-name."""
    if len(name) <= 63 and _DRIVER_NAME.fullmatch(name):
        return None
    return f"--dra-driver-name must be a DNS subdomain with a dot (e.g. vgpu.gpumgr.io), got {name[:70]!r}"


@dataclass(frozen=True)
class DraConfig:
    node_name: str
    driver_name: str = DRIVER_NAME
    cdi_dir: Path = Path("/var/run/cdi")
    plugin_dir: Path = Path(f"/var/lib/kubelet/plugins/{DRIVER_NAME}")
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    memory_unit_mib: int = 256
    dev_root: Path = Path("/dev")
    driver_dir: str = "/etc/gpu-manager/vdriver/driver"  # staged NVIDIA libraries (vdriver.py)
    shim_dir: str = "/etc/gpu-manager/vdriver"
    shim_log_level: int = 2
    api_timeout_s: float = 10.0  # one claim read from the API
    max_claims_per_call: int = 256  # a kubelet never sends more than the pods of one node use

    @property
    def socket(self) -> Path:
        return self.plugin_dir / DRA_SOCKET

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"


def from_agent_config(agent_cfg: AgentConfig) -> DraConfig:
    """The DRA settings of an `AgentConfig`: common ones from its fields, DRA ones from `extra` (as
    `gpumgr run` puts them there: mode, dra_driver_name, cdi_dir, dra_plugin_dir, plugins_registry_dir)."""
    from gpumgr.vdevice import vdriver

    extra = dict(agent_cfg.extra or {})
    driver = extra.get("dra_driver_name") or DRIVER_NAME
    shim_dir = agent_cfg.shim_dir
    return DraConfig(
        node_name=agent_cfg.node_name,
        driver_name=driver,
        cdi_dir=Path(extra.get("cdi_dir") or "/var/run/cdi"),
        plugin_dir=Path(extra.get("dra_plugin_dir") or f"/var/lib/kubelet/plugins/{driver}"),
        registry_dir=Path(extra.get("plugins_registry_dir") or "/var/lib/kubelet/plugins_registry"),
        memory_unit_mib=agent_cfg.memory_unit_mib,
        dev_root=Path(agent_cfg.dev_root),
        driver_dir=str(vdriver.driver_dir(Path(shim_dir))),
        shim_dir=shim_dir,
    )


def mode_of(agent_cfg: AgentConfig) -> str:
    """`device-plugin` (default), `dra` or `both`, from `AgentConfig.extra["mode"]`."""
    mode = (agent_cfg.extra or {}).get("mode") or "device-plugin"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode
