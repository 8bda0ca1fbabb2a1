"""DRA driver: NodePrepareResources latency with 110 claims on the node (goal p99 <= 20 ms) and ResourceSlice
publish latency after a health change (goal <= 1 s).

    .venv/bin/python tests/bench/bench_dra.py [--claims 110] [--rounds 3] [--flips 20]

The whole simulated node runs in this process: the API test server (real `kubernetes` client), the DRA front end
over a real NodeState (checkpoint written on every change, fsync included), the vDevice manager, and the kubelet
DRA emulator calling over the unix socket. Each NodePrepareResources call carries one claim, as the kubelet does
for a pod with one claim; claim i is prepared with i-1 already on the node. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpumgr.dra.config import DRIVER_NAME  # noqa: E402
from tests.bench.stats import summary_ms  # noqa: E402
from tests.dra.harness import NODE, NS, DraNode, remove_root, share_request, short_root  # noqa: E402


async def prepare_round(claims: int) -> tuple[list[float], list[float], list[float]]:
    root = short_root()
    node = DraNode(root, n_gpus=8)
    await node.start()
    try:
        node.create_template("t", [share_request(memory="256Mi", cores=5)])
        entries = []
        for i in range(claims):
            node.create_pod(f"p{i}", {"gpu": {"resourceClaimTemplateName": "t"}})
            node.scheduler.schedule_pod(NS, f"p{i}", [NODE])
            pod = node.api.store.get_pod(NS, f"p{i}")
            name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            entries.append((NS, name, node.claim(name)["metadata"]["uid"]))
        prep, unprep, ckpt = [], [], []
        assert node.state is not None
        for e in entries:
            t0 = time.perf_counter()
            resp = await node.kubelet.prepare(DRIVER_NAME, [e])
            prep.append(time.perf_counter() - t0)
            ckpt.append(node.state.last_checkpoint_s)
            if resp.claims[e[2]].error:
                print(f"  prepare failed: {resp.claims[e[2]].error}")
        assert len(node.dra_allocations()) == claims
        for e in entries:
            t0 = time.perf_counter()
            await node.kubelet.unprepare(DRIVER_NAME, [e])
            unprep.append(time.perf_counter() - t0)
        return prep, unprep, ckpt
    finally:
        await node.stop()
        remove_root(root)


async def publish_round(flips: int) -> list[float]:
    root = short_root()
    node = DraNode(root, n_gpus=8)
    await node.start()
    try:
        assert node.state is not None
        samples = []
        for i in range(flips):
            sick = i % 2 == 0
            t0 = time.perf_counter()
            await node.state.set_reason(3, "bench", sick)
            while True:
                [s] = node.api.store.list_resource("resourceslices")
                if ("taints" in s["spec"]["devices"][3]) == sick:
                    break
                await asyncio.sleep(0.001)
            samples.append(time.perf_counter() - t0)
        return samples
    finally:
        await node.stop()
        remove_root(root)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--claims", type=int, default=110)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flips", type=int, default=20)
    args = ap.parse_args(argv if argv is not None else [])
    prep: list[float] = []
    unprep: list[float] = []
    ckpt: list[float] = []
    for r in range(args.rounds):
        p, u, c = asyncio.run(prepare_round(args.claims))
        prep += p
        unprep += u
        ckpt += c
        print(f"  round {r + 1}/{args.rounds}: prepare {summary_ms(p)}", flush=True)
    print(f"NodePrepareResources, 1 claim per call, up to {args.claims} claims on the node (goal p99 <= 20 ms): "
          f"{summary_ms(prep)}")
    print(f"  of which the checkpoint write (fsync; the node core's, same as for device-plugin pods): "
          f"{summary_ms(ckpt)}")
    print(f"NodeUnprepareResources, 1 claim per call: {summary_ms(unprep)}")
    pub = asyncio.run(publish_round(args.flips))
    print(f"ResourceSlice updated in the API after a health change (goal <= 1 s): {summary_ms(pub)}")


if __name__ == "__main__":
    main(sys.argv[1:])
