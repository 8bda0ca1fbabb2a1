"""Shared set-up of the end-to-end tests: a simulated node in a short /tmp directory (unix socket paths must
stay under 108 bytes)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.sim.node import SimNode
from tests.helpers import topo_path


@contextlib.asynccontextmanager
async def sim_node(topo: str = "dgx-a100", memory_mib: int = 16384, start_agent: bool = True,
                   **options: Any) -> AsyncIterator[SimNode]:
    workdir = Path(tempfile.mkdtemp(prefix="gm", dir="/tmp"))
    inv = inventory_from_topo_file(topo_path(topo), memory_mib=memory_mib)
    node = SimNode(workdir, inv, **options)
    try:
        await node.start(agent=start_agent)
        yield node
    finally:
        await node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def env_of(admitted: Any, container: str) -> dict[str, str]:
    resp = admitted.container(container).responses["tencent.com/vcuda-core"]
    return dict(resp.envs)


def mounts_of(admitted: Any, container: str) -> dict[str, str]:
    resp = admitted.container(container).responses["tencent.com/vcuda-core"]
    return {m.container_path: m.host_path for m in resp.mounts}
