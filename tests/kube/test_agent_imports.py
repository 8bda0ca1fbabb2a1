"""The device-plugin agent never imports the `kubernetes` package (~0.3 s and ~35 MiB) nor `networkx` (~0.1 s and
~12 MiB): the real `gpumgr run` process registers its plugins, admits a pod (annotations patched, pods watched) and
stops, and tells which of their modules it had loaded. In `--mode both` the DRA front end loads the official
client, as expected."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from gpumgr.requests import podspec
from gpumgr.sim.kubelet import ContainerRequest
from tests.e2e.agent_process import process_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


async def modules_of_agent(*extra: str) -> list[str]:
    async with process_node("imports-node", "dgx-a100", 40960, *extra) as n:
        out = n.workdir / "modules.txt"
        args = n.agent.args
        i = args.index("gpumgr.cli")
        args[i] = "tests.kube.modules_probe"
        os.environ["MODULES_OUT"] = str(out)
        try:
            n.agent.start()
        finally:
            del os.environ["MODULES_OUT"]
        if "--mode" not in extra:
            for res in (CORE, MEM):
                await n.kubelet.wait_registered(res, timeout=60)
            await n.kubelet.wait_for(lambda: bool(n.kubelet.devices(CORE)) and bool(n.kubelet.devices(MEM)), 30)
            pod = n.bound_pod("p", 1, 1)
            await n.kubelet.admit_pod(pod["metadata"]["uid"], [ContainerRequest("main", {CORE: 1, MEM: 1})])
        else:
            for _ in range(1200):  # an API object, not a kubelet change: poll for it
                if n.api.store.list_resource("resourceslices"):
                    break
                await asyncio.sleep(0.05)
            assert n.api.store.list_resource("resourceslices"), n.agent.logs()
        assert await asyncio.to_thread(n.agent.stop) == 0, n.agent.logs()  # the API server keeps answering
        return Path(out).read_text().split()


async def test_device_plugin_mode_never_imports_kubernetes_or_networkx() -> None:
    assert await modules_of_agent() == []


async def test_both_mode_loads_the_official_client_for_dra(tmp_path: Path) -> None:
    modules = await modules_of_agent("--mode", "both", "--cdi-dir", str(tmp_path / "cdi"), "--dra-plugin-dir",
                                     str(tmp_path / "dra"), "--plugins-registry-dir", str(tmp_path / "reg"))
    assert "kubernetes.client" in modules, sys.modules.keys()
