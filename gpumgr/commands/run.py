"""`gpumgr run`: the node agent daemon. Every flag can also come from GPUMGR_<FLAG> in the environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from gpumgr.commands.common import env_default

log = logging.getLogger("gpumgr")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run the node agent (device plugins, vDevice servers, metrics)")

    def opt(flag: str, default: str | None, help: str, **kw: object) -> None:
        p.add_argument(flag, default=env_default(flag, default), help=f"{help} (env GPUMGR_"
                       f"{flag.lstrip('-').upper().replace('-', '_')})", **kw)  # type: ignore[arg-type]

    opt("--node-name", os.environ.get("NODE_NAME"), "this node's name (default: env NODE_NAME)")
    opt("--kubeconfig", "", "kubeconfig file; empty = in-cluster")
    opt("--device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet device-plugin directory")
    opt("--vdevice-root", "/etc/gpu-manager/vm", "host directory of the per-container vDevice directories")
    opt("--checkpoint-dir", "/etc/gpu-manager/checkpoint", "directory of gpumgr's own checkpoint")
    opt("--memory-unit-mib", "256", "MiB per tencent.com/vcuda-memory unit", type=int)
    opt("--simulate", "", "node spec (YAML/JSON): use the simulated GPU backend instead of NVML")
    opt("--driver-root", "/usr/lib/x86_64-linux-gnu", "host directory of the NVIDIA driver libraries")
    opt("--shim-dir", "/etc/gpu-manager/vdriver", "host directory holding lib64/libvcuda.so")
    opt("--dev-root", "/dev", "where the agent looks for /dev/nvidia-uvm*")
    opt("--proc-root", "/proc", "the host's /proc (host PIDs)")
    opt("--cgroup-root", "/sys/fs/cgroup", "the host's cgroup mount")
    opt("--metrics-addr", "0.0.0.0:5678", "address of /metric, /graph, /usage, /healthz, /readyz")
    opt("--check-period", "30", "seconds between full reconciliations", type=float)
    opt("--unrecorded-grace", "60", "seconds an allocation the kubelet never recorded is kept before it is freed",
        type=float)
    opt("--health-ignore-xids", "13,31,43,45,68,109", "application XIDs that do not make a card unhealthy")
    opt("--temp-unhealthy", "95", "temperature (C) at which a card turns unhealthy", type=int)
    opt("--temp-healthy", "90", "temperature (C) below which it is healthy again", type=int)
    opt("--label-prefix", "gpumgr.io/", "prefix of the node labels")
    opt("--log-level", "info", "debug, info, warning, error", choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--cdi", action="store_true", default=env_default("--cdi", "") in ("1", "true", "yes"),
                   help="also answer Allocate with CDI device names (env GPUMGR_CDI)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumgr.agent.config import AgentConfig
    from gpumgr.docfile import InputError

    if not args.node_name:
        raise InputError("--node-name (or env NODE_NAME) is required")
    try:
        xids = tuple(int(x) for x in str(args.health_ignore_xids).split(",") if x.strip())
    except ValueError:
        bad = args.health_ignore_xids
        raise InputError(f"--health-ignore-xids must be a comma list of numbers, got {bad!r}") from None
    if args.memory_unit_mib <= 0:
        raise InputError("--memory-unit-mib must be positive")
    cfg = AgentConfig(
        node_name=args.node_name, kubeconfig=args.kubeconfig, device_plugin_dir=Path(args.device_plugin_dir),
        vdevice_root=Path(args.vdevice_root), checkpoint_dir=Path(args.checkpoint_dir),
        memory_unit_mib=args.memory_unit_mib, simulate=args.simulate, driver_root=args.driver_root,
        shim_dir=args.shim_dir, dev_root=Path(args.dev_root), proc_root=Path(args.proc_root),
        cgroup_root=Path(args.cgroup_root), metrics_addr=args.metrics_addr, check_period_s=args.check_period,
        grace_s=args.unrecorded_grace,
        health_ignore_xids=xids, temp_unhealthy_c=args.temp_unhealthy, temp_healthy_c=args.temp_healthy,
        label_prefix=args.label_prefix, cdi=bool(args.cdi),
    )
    return asyncio.run(_main(cfg))


async def _main(cfg: object) -> int:
    from gpumgr.agent.config import AgentConfig
    from gpumgr.agent.daemon import Agent
    from gpumgr.devices.backend import Backend
    from gpumgr.kube.client import KubeClient

    assert isinstance(cfg, AgentConfig)
    backend: Backend
    if cfg.simulate:
        from gpumgr.devices.simulated import SimulatedBackend

        backend = SimulatedBackend.from_spec(cfg.simulate)
    else:
        from gpumgr.devices.nvml import NvmlBackend

        backend = NvmlBackend()
    try:
        kube = KubeClient.connect(cfg.kubeconfig or None)
    except Exception as e:  # noqa: BLE001 - one clear line instead of a traceback
        log.error("cannot reach the Kubernetes API (%s): %s", cfg.kubeconfig or "in-cluster", e)
        return 1
    agent = Agent(cfg, backend, kube)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.start()
        log.info("agent ready on node %s", cfg.node_name)
        await stop.wait()
    finally:
        await agent.stop()
        backend.close()
        kube.close()
    print("gpumgr agent stopped", file=sys.stderr)
    return 0
