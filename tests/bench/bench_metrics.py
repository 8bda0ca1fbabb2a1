"""`/metric` on a busy node: 8 cards x 64 GPU containers (cgroup trees in a temp dir, simulated NVML).

Prints the scrape latency (collect + render alone, and end to end over HTTP; goal <= 50 ms) and the event loop's
lag while scrapes run, against the lag when the same scrape runs on the loop (what the executor avoids).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpumgr.metrics import build_app, start_http
from tests.bench.stats import pct, summary_ms
from tests.metrics.node import GIB, RecordingBackend, SimNode

CARDS = 8
CONTAINERS = 64
PIDS_PER_CONTAINER = 3
NVML_DELAY_S = 0.002  # an assumed cost of one card's NVML calls (not measured here: no GPU)


class SlowBackend(RecordingBackend):
    def status(self, index: int) -> Any:
        time.sleep(NVML_DELAY_S)
        return super().status(index)


async def busy_node(tmp: Path, version: str, driver: str, runtime: str) -> SimNode:
    node = SimNode(tmp, n_cards=CARDS, version=version, driver=driver, runtime=runtime)
    pid = 1000
    per_card = CONTAINERS // CARDS
    for i in range(CONTAINERS):
        card = i % CARDS
        pids = list(range(pid, pid + PIDS_PER_CONTAINER))
        pid += PIDS_PER_CONTAINER
        # pods of two containers each, spread over QoS classes
        await node.place(f"pod-{i // 2}", f"c{i % 2}", (card,), cores=100 // per_card - 2, memory_mib=1024,
                         pids=pids, qos=("burstable", "besteffort", "guaranteed")[(i // 2) % 3])
        for p in pids[:2]:  # two of three processes use the GPU
            node.sim.set_process(card, p, used_memory_bytes=GIB // 4, sm_util=3)
    for card in range(CARDS):
        node.sim.set_process(card, 90_000 + card, used_memory_bytes=GIB, sm_util=5)  # outside any container
    return node


def collect_render(registry: CollectorRegistry, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        generate_latest(registry)
        samples.append(time.perf_counter() - t0)
    return samples


async def lag_while(work: Any, seconds: float) -> list[float]:
    """Overshoot of 1 ms sleeps on the loop while `work()` runs (a coroutine)."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    t = asyncio.create_task(ticker())
    await work(seconds)
    stop.set()
    await t
    return lags


CLIENT = """
import json, sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
out, end = [], time.perf_counter() + seconds
while time.perf_counter() < end:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        r.read()
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


async def remote_client(url: str, seconds: float) -> list[float]:
    """Scrapes back to back from another process, as Prometheus would (no GIL shared with the agent)."""
    p = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, url, str(seconds),
                                             stdout=asyncio.subprocess.PIPE)
    out, _ = await p.communicate()
    return [float(x) for x in json.loads(out)]


async def over_http(node: SimNode) -> None:
    app = build_app(node.metrics, node.reader())
    server = await start_http(app, "127.0.0.1", 0)
    url = server.url + "/metric"
    try:
        scrapes: list[float] = []

        async def scraping(seconds: float) -> None:
            scrapes.extend(await remote_client(url, seconds))

        idle = await lag_while(asyncio.sleep, 1.0)
        busy = await lag_while(scraping, 3.0)
        print(f"  HTTP GET /metric end to end (client in another process): {summary_ms(scrapes)}")
        print(f"  event-loop lag (1 ms sleeps), idle:                           {summary_ms(idle)}")
        print(f"  event-loop lag while serving those scrapes (collect in thread): {summary_ms(busy)}")

        registry = node.metrics.registry
        loop = asyncio.get_running_loop()

        async def in_executor(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                await loop.run_in_executor(None, generate_latest, registry)

        async def on_loop(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                generate_latest(registry)  # what a naive handler does: collect and render on the loop
                await asyncio.sleep(0)

        threaded = await lag_while(in_executor, 2.0)
        blocked = await lag_while(on_loop, 2.0)
        print(f"  event-loop lag, scrapes back to back in the executor:         {summary_ms(threaded)}")
        print(f"  event-loop lag, the same scrapes ON the loop (avoided):        {summary_ms(blocked)}")
    finally:
        await server.close()


async def run() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"Scrape of {CARDS} cards x {CONTAINERS} containers ({PIDS_PER_CONTAINER} PIDs each), goal <= 50 ms:")
        for version, driver, runtime in (("v2", "systemd", "containerd"), ("v1", "cgroupfs", "docker"),
                                         ("v2", "systemd", "crio")):
            node = await busy_node(Path(tmp) / f"{version}-{driver}-{runtime}", version, driver, runtime)
            node.metrics.attach(node.reader())
            s = collect_render(node.metrics.registry, 200)
            print(f"  collect + render, cgroup {version} {driver} {runtime:10s}: {summary_ms(s)}")
        node = await busy_node(Path(tmp) / "http", "v2", "systemd", "containerd")
        await over_http(node)

        slow = await busy_node(Path(tmp) / "slow", "v2", "systemd", "containerd")
        slow.backend = SlowBackend(slow.sim)
        slow.metrics.attach(slow.reader())
        timings: list[float] = []

        async def in_thread(seconds: float) -> None:
            timings.extend(await asyncio.to_thread(collect_render, slow.metrics.registry, 50))

        lags = await lag_while(in_thread, 0)
        print(f"  with NVML at {NVML_DELAY_S * 1000:.0f} ms per card, collect + render in a thread: "
              f"{summary_ms(timings)}")
        print(f"  event-loop lag meanwhile: p50 {pct(lags, 50) * 1000:.3f} ms, p99 {pct(lags, 99) * 1000:.3f} ms, "
              f"max {max(lags) * 1000:.3f} ms (n={len(lags)})")


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
