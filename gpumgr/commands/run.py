"""`gpumgr run`: the node agent daemon. Every flag can also come from GPUMGR_<FLAG> in the environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from pathlib import Path

from gpumgr.agent.config import AgentConfig
from gpumgr.commands.common import check_log_level, env_default, seconds_flag, whole_flag
from gpumgr.requests.podspec import ascii_uint

log = logging.getLogger("gpumgr")
# bounds of the numeric flags (a value past them switches off what it sets, or is a typo)
MAX_MEMORY_UNIT_MIB = 65536  # one unit of 64 GiB: larger than any card's memory
MAX_CHECK_PERIOD_S = 3600.0  # a reconcile at least hourly
MAX_GRACE_S = 86400.0  # an allocation the kubelet never recorded is freed within a day
MAX_TEMP_C = 150  # no GPU runs hotter; the drivers' own slowdown/shutdown thresholds are below it


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run the node agent (device plugins, vDevice servers, metrics)")

    def opt(flag: str, default: str | None, help: str, **kw: object) -> None:
        p.add_argument(flag, default=env_default(flag, default), help=f"{help} (env GPUMGR_"
                       f"{flag.lstrip('-').upper().replace('-', '_')})", **kw)  # type: ignore[arg-type]

    opt("--node-name", os.environ.get("NODE_NAME"), "this node's name (default: env NODE_NAME)")
    if not p.get_default("node_name"):
        p.set_defaults(node_name=os.environ.get("NODE_NAME"))
    opt("--kubeconfig", "", "kubeconfig file; empty = in-cluster")
    opt("--device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet device-plugin directory")
    opt("--vdevice-root", "/etc/gpu-manager/vm", "host directory of the per-container vDevice directories")
    opt("--checkpoint-dir", "/etc/gpu-manager/checkpoint", "directory of gpumgr's own checkpoint")
    opt("--memory-unit-mib", "256", f"MiB per tencent.com/vcuda-memory unit (1 to {MAX_MEMORY_UNIT_MIB})")
    opt("--simulate", "", "node spec (YAML/JSON): use the simulated GPU backend instead of NVML")
    opt("--driver-root", "/usr/lib/x86_64-linux-gnu", "host directory of the NVIDIA driver libraries")
    opt("--shim-dir", "/etc/gpu-manager/vdriver", "host directory the agent fills with lib64/libvcuda.so and "
        "driver/ (the NVIDIA libraries) for GPU containers to mount")
    opt("--shim-source", "/usr/local/lib/gpumgr/libvcuda.so", "the shim in the agent's image, copied to --shim-dir")
    opt("--nvml-lib", "", "libnvidia-ml.so.1 for the agent itself (e.g. under /host/usr/lib/...); empty = the "
        "loader's search path")
    opt("--sysfs-root", "/sys", "the host's /sys (the NVML backend reads each GPU's NUMA node from "
        "bus/pci/devices/<bus id>/numa_node there)")
    opt("--dev-root", "/dev", "where the agent looks for /dev/nvidia-uvm*")
    opt("--proc-root", "/proc", "the host's /proc (host PIDs)")
    opt("--cgroup-root", "/sys/fs/cgroup", "the host's cgroup mount")
    opt("--metrics-addr", "0.0.0.0:5678", "address of /metric, /graph, /usage, /healthz, /readyz")
    opt("--check-period", "30", f"seconds between full reconciliations (0.1 to {MAX_CHECK_PERIOD_S:g})")
    opt("--unrecorded-grace", "60", "seconds an allocation the kubelet never recorded is kept before it is freed "
        f"(0 to {MAX_GRACE_S:g})")
    opt("--health-ignore-xids", "13,31,43,45,68,109", "application XIDs that do not make a card unhealthy")
    opt("--temp-unhealthy", "95", f"temperature (C) at which a card turns unhealthy (1 to {MAX_TEMP_C})")
    opt("--temp-healthy", "90", f"temperature (C) below which it is healthy again (1 to {MAX_TEMP_C})")
    opt("--label-prefix", "gpumgr.io/", "prefix of the node labels")
    opt("--log-level", "info", "debug, info, warning, error")
    opt("--mode", "device-plugin", "front ends: device-plugin, dra (DRA driver) or both (one ledger for both)")
    opt("--dra-driver-name", "vgpu.gpumgr.io", "DRA driver name (ResourceSlices, CDI, kubelet registration)")
    opt("--cdi-dir", "/var/run/cdi", "dynamic CDI spec directory the DRA driver writes claim specs to")
    opt("--dra-plugin-dir", "", "directory of the DRA socket dra.sock (default /var/lib/kubelet/plugins/<driver>)")
    opt("--plugins-registry-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registration directory "
        "(the DRA registration socket <driver>-reg.sock)")
    opt("--mig-layout", "", "MIG layout for the device plugins: all-<profile> (e.g. all-1g.10gb), all-balanced, "
        "all-disabled or a name from --mig-layouts-file; the node label nvidia.com/mig.config wins; empty: leave "
        "the cards' instances as they are")
    opt("--mig-layouts-file", "", "JSON file of named MIG layouts: {name: {\"all\" | \"<card>\": [profile, ...]}}")
    opt("--mig-shared", "", "MIG profiles of the layout served as shares: <profile>=<replicas>[,...] (e.g. "
        "1g.10gb=4): each instance is <replicas> devices of <prefix><profile>.shared, each a share with its memory "
        "enforced (the instance's memory / replicas)")
    opt("--mig-resource-prefix", "nvidia.com/mig-", "resource name prefix of the MIG device plugins")
    opt("--mig-minors", "/proc/driver/nvidia-caps/mig-minors", "the driver's MIG capability minors file")
    opt("--mig-strategy", "mixed", "how the device plugins name MIG instances: mixed (<prefix><profile>, as "
        "NVIDIA's mixed strategy; the only one gpumgr serves)")
    p.add_argument("--cdi", action="store_true",
                   default=str(env_default("--cdi", "")).strip().lower() in ("1", "true", "yes", "on"),
                   help="also answer Allocate with CDI device names (env GPUMGR_CDI)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from(args)
    return asyncio.run(_main(cfg, sysfs_root=str(args.sysfs_root)))


def config_from(args: argparse.Namespace) -> AgentConfig:
    """Check every flag before anything starts: a bad value is one clear line and exit 2, never a traceback."""
    from gpumgr.files.docfile import InputError
    from gpumgr.health.config import HealthConfig

    if not args.node_name:
        raise InputError("--node-name (or env GPUMGR_NODE_NAME / NODE_NAME) is required")
    try:
        xids = tuple(whole_flag("--health-ignore-xids", x, 0, 1 << 31) for x in str(args.health_ignore_xids).split(",")
                     if x.strip())
    except InputError:
        raise InputError(f"--health-ignore-xids must be a comma list of numbers, got {args.health_ignore_xids!r}") \
            from None
    check_log_level(args.log_level)
    unit_mib = whole_flag("--memory-unit-mib", args.memory_unit_mib, 1, MAX_MEMORY_UNIT_MIB)
    check_period = seconds_flag("--check-period", args.check_period, MAX_CHECK_PERIOD_S, low=0.1)
    grace = seconds_flag("--unrecorded-grace", args.unrecorded_grace, MAX_GRACE_S, low=0)
    temp_unhealthy = whole_flag("--temp-unhealthy", args.temp_unhealthy, 1, MAX_TEMP_C)
    temp_healthy = whole_flag("--temp-healthy", args.temp_healthy, 1, MAX_TEMP_C)
    try:
        HealthConfig(ignored_xids=frozenset(xids), temp_unhealthy_c=temp_unhealthy, temp_healthy_c=temp_healthy)
    except ValueError as e:
        raise InputError(f"health settings: {e}") from None
    host, _, port = str(args.metrics_addr).rpartition(":")
    if not host or ascii_uint(port, 5) is None:
        raise InputError(f"--metrics-addr must be HOST:PORT, got {args.metrics_addr!r}")
    dra = dra_settings(args)
    mig_layout, mig_layouts_file = str(args.mig_layout), str(args.mig_layouts_file)
    prefix = str(args.mig_resource_prefix)
    if mig_layout or mig_layouts_file:
        from gpumgr.mig.agent import load_layouts
        from gpumgr.mig.layout import LayoutError, parse

        try:
            layouts = load_layouts(mig_layouts_file)
            if mig_layout:
                parse(mig_layout, layouts)
        except (LayoutError, ValueError) as e:
            raise InputError(str(e)) from None
    try:
        from gpumgr.mig.agent import parse_shared

        shared = parse_shared(str(args.mig_shared))
    except ValueError as e:
        raise InputError(str(e)) from None
    strategy = str(args.mig_strategy)
    if strategy != "mixed":
        raise InputError(f"--mig-strategy must be mixed (one resource per profile, <prefix><profile>), got "
                         f"{strategy[:40]!r}: gpumgr does not serve NVIDIA's single strategy (instances as "
                         "nvidia.com/gpu) nor none (use --mig-layout all-disabled to leave MIG cards empty)")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,200}[a-z0-9])?/[A-Za-z0-9][-A-Za-z0-9_.]{0,30}", prefix + "x"):
        raise InputError(f"--mig-resource-prefix must be a resource name prefix like nvidia.com/mig-, got {prefix!r}")
    return AgentConfig(
        node_name=args.node_name, kubeconfig=args.kubeconfig, device_plugin_dir=Path(args.device_plugin_dir),
        vdevice_root=Path(args.vdevice_root), checkpoint_dir=Path(args.checkpoint_dir),
        memory_unit_mib=unit_mib, simulate=args.simulate, driver_root=args.driver_root,
        shim_dir=args.shim_dir, shim_source=args.shim_source, nvml_lib=args.nvml_lib,
        dev_root=Path(args.dev_root), proc_root=Path(args.proc_root), cgroup_root=Path(args.cgroup_root),
        metrics_addr=args.metrics_addr, check_period_s=check_period, grace_s=grace,
        health_ignore_xids=xids, temp_unhealthy_c=temp_unhealthy, temp_healthy_c=temp_healthy,
        label_prefix=args.label_prefix, cdi=bool(args.cdi), extra=dra, mig_layout=mig_layout,
        mig_layouts_file=mig_layouts_file, mig_prefix=prefix, mig_shared=tuple(sorted(shared.items())),
        mig_minors=Path(str(args.mig_minors)),
    )


def dra_settings(args: argparse.Namespace) -> dict[str, str]:
    """The DRA flags, checked, as `AgentConfig.extra` (read back by gpumgr.dra.config.from_agent_config)."""

    from gpumgr.dra.config import MODES, driver_name_problem
    from gpumgr.files.docfile import InputError

    mode = str(getattr(args, "mode", "device-plugin"))
    if mode not in MODES:
        raise InputError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    driver = str(getattr(args, "dra_driver_name", "vgpu.gpumgr.io"))
    problem = driver_name_problem(driver)
    if problem:
        raise InputError(problem)
    plugin_dir = str(getattr(args, "dra_plugin_dir", "") or f"/var/lib/kubelet/plugins/{driver}")
    registry = str(getattr(args, "plugins_registry_dir", "/var/lib/kubelet/plugins_registry"))
    for flag, path in (("--dra-plugin-dir", f"{plugin_dir}/dra.sock"),
                       ("--plugins-registry-dir", f"{registry}/{driver}-reg.sock")):
        if len(path.encode()) >= 108:
            raise InputError(f"{flag}: socket path {path} is longer than a unix socket allows (107 bytes)")
    return {"mode": mode, "dra_driver_name": driver, "cdi_dir": str(getattr(args, "cdi_dir", "/var/run/cdi")),
            "dra_plugin_dir": plugin_dir, "plugins_registry_dir": registry}


async def _main(cfg: AgentConfig, sysfs_root: str = "/sys") -> int:
    from gpumgr.agent.daemon import Agent
    from gpumgr.devices.backend import Backend
    from gpumgr.devices.types import DiscoveryError
    from gpumgr.files.docfile import InputError
    from gpumgr.kube.client import KubeClient

    backend: Backend
    if cfg.simulate:
        from gpumgr.devices.simulated import SimulatedBackend

        backend = SimulatedBackend.from_spec(cfg.simulate)
    else:
        from gpumgr.devices.nvml import NvmlBackend

        backend = NvmlBackend(library=cfg.nvml_lib or None, sysfs_root=sysfs_root)
    try:
        kube = KubeClient.connect(cfg.kubeconfig or None)
    except InputError:
        backend.close()
        raise  # a kubeconfig the agent cannot use: one line naming the file and field, exit 2
    except Exception as e:  # noqa: BLE001 - one clear line instead of a traceback
        log.error("cannot reach the Kubernetes API (%s): %s", cfg.kubeconfig or "in-cluster", e)
        return 1
    agent = Agent(cfg, backend, kube)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await agent.start()
        except DiscoveryError:
            raise
        except Exception as e:  # noqa: BLE001 - one clear line, never a traceback
            log.error("the agent could not start: %s: %s", type(e).__name__, e)
            log.debug("start failure", exc_info=True)
            return 1
        log.info("agent started on node %s; plugins registering with the kubelet", cfg.node_name)
        await stop.wait()
    finally:
        await agent.stop()
        backend.close()
        await kube.aclose()
    print("gpumgr agent stopped", file=sys.stderr)
    return 0
