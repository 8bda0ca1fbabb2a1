"""Issue 18, not yet attacked: `gpumgr run` against a hostile or broken API server. The agent runs as its own
process in a memory cgroup of the chart's limit (512 MiB), its kubelet device plugins served to the kubelet
emulator, its API calls through a proxy that turns hostile (floods of fat bookmarks, then every watch 410 Gone so
the pod cache lists again into 256 MiB lists that ignore `limit`; 500 on every write) and then goes away (every
connection dropped). Throughout, the device plugins stay
registered and answer the kubelet, the agent stays under its limit, and nothing admitted before is lost; once the
server is back, a new pod is admitted."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpumgr.deviceplugin import ids as devids
from gpumgr.devices.spec import load_node_spec
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.sim.kubeapi.kubeconfig import write_kubeconfig
from gpumgr.vdevice.layout import allocation_key
from tests.e2e.agent_process import process_node
from tests.e2e.test_kill9 import CORE, MEM, admit, wait_ready
from tests.hardening.hostile_api import SwitchingProxy, met_a_huge_list
from tests.hardening.memcap import Capped, chart_memory_limit

HOSTILE_S = 8.0
GONE_S = 8.0


async def test_the_agent_keeps_serving_the_kubelet_through_a_hostile_then_absent_api(tmp_path: Path) -> None:
    limit = chart_memory_limit("agent")
    async with process_node("hostile-node", "dgx-a100", 16384, "--check-period", "1") as n:
        async with SwitchingProxy(n.api.url) as proxy:
            write_kubeconfig(n.workdir / "kubeconfig", proxy.url)  # the agent's API calls go through the proxy
            agent = Capped.start(n.agent.args, limit, tmp_path / "agent.log", dict(os.environ))
            try:
                await wait_ready(n.kubelet, 1)
                first = n.bound_pod("before", 4, 1)
                assert await admit(n.kubelet, n.api, first), agent.output()

                for mode, seconds in (("expire", HOSTILE_S), ("flood", HOSTILE_S), ("gone", GONE_S)):
                    proxy.switch(mode)
                    await asyncio.sleep(seconds)
                    if mode == "expire":  # the pod cache has met a 256 MiB list (asserted below; a loaded machine
                        deadline = asyncio.get_running_loop().time() + 90  # may need longer than the window)
                        while not met_a_huge_list(proxy, agent.log) and asyncio.get_running_loop().time() < deadline:
                            await asyncio.sleep(0.1)
                    assert agent.alive(), agent.output()
                    for res in (CORE, MEM):  # the kubelet still has its plugins and their healthy devices
                        assert n.kubelet.is_registered(res), (mode, res)
                        assert n.kubelet.devices(res) and all(h == "Healthy" for h in n.kubelet.devices(res).values())

                proxy.switch("pass")
                second = n.bound_pod("after", 4, 1)
                for _ in range(30):  # the pod cache lists again after its backoff (at most 10 s)
                    if await admit(n.kubelet, n.api, second):
                        break
                    n.api.store.set_pod_phase("default", "after", "Pending")
                    await asyncio.sleep(1)
                else:
                    raise AssertionError(agent.output())
                peak = agent.peak_rss()
                calls = dict(proxy.calls)
                lists = proxy.hostile["expire"].lists
            finally:
                agent.close()
            log = agent.log.read_text(errors="replace")
        print(f"\nagent {agent.where}: {HOSTILE_S:g} s of bookmark floods ({calls.get('flood', 0)} calls), "
              f"{HOSTILE_S:g} s of 410s and 256 MiB lists ({lists} lists), {GONE_S:g} s gone ({calls.get('gone', 0)} "
              f"calls); peak RSS {peak / 2**20:.0f} MiB (limit {limit >> 20} MiB)")
        assert lists >= 1 and "an answer over 33554432 bytes" in log
        assert peak < limit
        assert "Traceback" not in log
        ledger = CheckpointStore(n.workdir / "ckpt").load().snapshot.ledger
        inv = load_node_spec(n.spec)
        want = {}
        for pod in (first, second):
            ids = n.kubelet.pod_devices(pod["metadata"]["uid"])["main"][CORE]
            want[allocation_key(ids)] = tuple(sorted(devids.cards_of(inv, ids, "c")))
        assert {k: a.cards for k, a in ledger.allocations.items()} == want  # nothing admitted was lost
