"""What an extender failover costs: from the leader's death to the first pod bound through the one address.

    .venv/bin/python -m tests.bench extender_ha      [GPUMGR_BENCH_HA_RUNS=5]

Each run: the API test server, two `gpumgr extender --leader-elect` processes behind the test front (the chart's
Service: ready, and the pod labelled gpumgr.io/extender-leader=true by the leader; `tests/extender/front.py`,
polling /readyz and the labels every 0.1 s), one pod bound through the front, then
the leader is stopped and a client does what kube-scheduler does (filter, bind, retry every 50 ms) until the
next pod is bound. Timed from the signal to that bind. Three cases:
- kill -9 with the chart's timings (lease 15 s, renew deadline 10 s, retry 2 s): the standby waits out the Lease;
- kill -9 with short timings (lease 3 s, renew 2 s, retry 0.3 s), as the tests use;
- SIGTERM with the chart's timings: the leader releases the Lease, the standby takes it at its next retry.
A real Service adds the endpoints controller's reaction to the label change on top. Prints figures; asserts
nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402

from gpumgr.sim.kubeapi import KubeApiServer  # noqa: E402
from tests.bench.stats import pct  # noqa: E402
from tests.extender.front import Backend, Front  # noqa: E402
from tests.extender.support import (  # noqa: E402
    LEASE_NS,
    Replica,
    args,
    inventory,
    lease_holder,
    node,
    pod,
    replica_pod,
    start_replica,
)

RUNS = int(os.environ.get("GPUMGR_BENCH_HA_RUNS", "5"))
CASES = [("kill -9, lease 15s/renew 10s/retry 2s", signal.SIGKILL, ("15", "10", "2")),
         ("kill -9, lease 3s/renew 2s/retry 0.3s", signal.SIGKILL, ("3", "2", "0.3")),
         ("SIGTERM, lease 15s/renew 10s/retry 2s", signal.SIGTERM, ("15", "10", "2"))]


async def bind_one(http: aiohttp.ClientSession, url: str, p: dict[str, Any]) -> None:
    meta = p["metadata"]
    while True:
        try:
            async with http.post(f"{url}/gpumgr/filter", json=args(p, ["n0"])) as r:
                ok = r.status == 200 and (await r.json()).get("NodeNames") == ["n0"]
            if ok:
                async with http.post(f"{url}/gpumgr/bind", json={"PodName": meta["name"], "PodNamespace": "default",
                                                                 "PodUID": meta["uid"], "Node": "n0"}) as r:
                    if r.status == 200 and (await r.json()).get("Error") == "":
                        return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.05)


async def one_run(tmp: Path, sig: int, timings: tuple[str, str, str]) -> float:
    async with KubeApiServer() as api, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        api.store.create_node(node("n0", inventory(2)))
        pods = [api.store.create_pod(pod(f"p{i}", [(10, 4)])) for i in range(2)]
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        duration, renew, retry = timings
        for i in range(2):
            api.store.create_pod(replica_pod(f"ext-{i}"))
        reps = [start_replica(f"ext-{i}", kubeconfig, tmp, duration=duration, renew=renew, retry=retry)
                for i in range(2)]
        try:
            async with Front([Backend(r.url, r.probe_url, pod=r.name) for r in reps], api.store, LEASE_NS) as front:
                await bind_one(http, front.url, pods[0])
                holder = lease_holder(api.store)
                leader: Replica = next(r for r in reps if r.holds(holder))
                t0 = time.perf_counter()
                leader.proc.send_signal(sig)
                await bind_one(http, front.url, pods[1])
                return time.perf_counter() - t0
        finally:
            for r in reps:
                await asyncio.get_running_loop().run_in_executor(None, r.stop)


async def run() -> None:
    for label, sig, timings in CASES:
        samples = []
        for _ in range(RUNS):
            with tempfile.TemporaryDirectory() as tmp:
                samples.append(await one_run(Path(tmp), sig, timings))
        print(f"  {label}: leader stopped -> next pod bound through the front: p50 {pct(samples, 50):.2f} s, "
              f"max {max(samples):.2f} s, min {min(samples):.2f} s (n={len(samples)})", flush=True)


def main() -> None:
    print(f"Extender failover, 2 replicas behind one address, {RUNS} runs per case:")
    asyncio.run(run())


if __name__ == "__main__":
    main()
