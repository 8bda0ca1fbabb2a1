"""Node agent: admission round trip through the kubelet emulator with 110 pods on the node, agent start to
registered (first start, and a restart with 500 allocations in its checkpoint and pods on the node), and the agent's
RSS after 500 allocations. The agent runs as its own process (`gpumgr run`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gpumgr.requests import podspec
from gpumgr.sim.kubelet import ContainerRequest, KubeletEmulator
from tests.bench.stats import summary_ms
from tests.e2e.agent_process import AgentProcess, process_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY
NODE = "bench-node"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def time_rpcs(into: dict[str, list[float]]) -> None:
    """Record how long each Allocate and PreStartContainer takes as the kubelet sees it."""
    from gpumgr.sim.kubelet import endpoint

    cls = endpoint.PluginEndpoint
    for name in ("allocate", "pre_start_container"):
        orig = getattr(cls, name)

        async def timed(self, *a, __orig=orig, __name=name, **k):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return await __orig(self, *a, **k)
            finally:
                into.setdefault(f"{__name} {self.resource}", []).append(time.perf_counter() - t)

        setattr(cls, name, timed)


async def first_starts(times: int) -> list[float]:
    """Process start to both plugins registered, each on a fresh node (no checkpoint, no pods)."""
    took = []
    for _ in range(times):
        async with process_node(NODE, "dgx-a100", 40960, "--log-level", "warning") as n:
            took.append(await start_to_registered(n.agent, n.kubelet))
            await asyncio.to_thread(n.agent.stop)
    return took


async def start_to_registered(agent: AgentProcess, kubelet: KubeletEmulator) -> float:
    counts = {res: kubelet.registration_count(res) for res in (CORE, MEM)}
    t0 = time.perf_counter()
    agent.start()
    for res in (CORE, MEM):
        await kubelet.wait_registered(res, timeout=60, count=counts[res] + 1)
    return time.perf_counter() - t0


async def run() -> None:
    starts = await first_starts(5)
    print(f"  agent process start to both plugins registered (first start, 5 runs): {summary_ms(starts)}")
    async with process_node(NODE, "dgx-a100", 40960, "--log-level", "warning") as n:
        api, kubelet, agent = n.api, n.kubelet, n.agent
        await start_to_registered(agent, kubelet)
        await kubelet.wait_for(lambda: bool(kubelet.devices(CORE)) and bool(kubelet.devices(MEM)), 30)
        assert agent.proc is not None
        base_rss = rss_mib(agent.proc.pid)

        async def admit(name: str) -> float:
            pod = n.bound_pod(name, 1, 1)
            t = time.perf_counter()
            await kubelet.admit_pod(pod["metadata"]["uid"], [ContainerRequest("main", {CORE: 1, MEM: 1})])
            took = time.perf_counter() - t
            api.store.set_pod_phase("default", name, "Running")
            return took

        for i in range(110):
            await admit(f"base-{i}")
        samples = []
        rpcs: dict[str, list[float]] = {}
        time_rpcs(rpcs)
        for i in range(200):  # keep 110 pods on the node: admit one, remove one
            samples.append(await admit(f"churn-{i}"))
            uid = api.store.get_pod("default", f"churn-{i}")["metadata"]["uid"]
            api.store.delete_pod("default", f"churn-{i}")
            await kubelet.remove_pod(uid)
        print(f"  admission round trip with 110 pods on the node (GetPreferredAllocation + Allocate for both "
              f"resources + PreStartContainer, both sides' fsync'd checkpoints): {summary_ms(samples)}")
        for name, vals in sorted(rpcs.items()):
            if name.startswith("allocate") or CORE in name:
                print(f"    {name} round trip: {summary_ms(vals)}")
        for i in range(500 - 110):
            await admit(f"more-{i}")
        await asyncio.sleep(1)
        print(f"  agent RSS: {base_rss:.1f} MiB at start, {rss_mib(agent.proc.pid):.1f} MiB with 500 allocations")
        await asyncio.to_thread(agent.stop)
        restarted = await start_to_registered(agent, kubelet)
        print(f"  agent restart with 500 allocations and pods on the node to both plugins registered: "
              f"{restarted * 1000:.0f} ms")
        await asyncio.to_thread(agent.stop)


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
