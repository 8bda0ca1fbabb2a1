"""MIG over the real nvidia-ml-py on the fake NVML: a claim's instance created and destroyed at prepare time
(NodeState commits with their checkpoint fsyncs included), and the agent's start-up reconcile of 4 cards x 7
instances (all recorded; and none recorded, so all 28 destroyed)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from gpumgr.devices.fake_nvml_node import mig_minors_text
from gpumgr.devices.nvml import NvmlBackend
from gpumgr.devices.types import GPU, Inventory
from gpumgr.dra.mig_prepare import MigClaims, MigResult
from gpumgr.mig import node as mig_node
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState, load_checkpoint
from tests.bench.stats import summary_ms
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode

CARDS = 4
ROUNDS = 40
UID = "0b1c2d3e-0000-4000-8000-0000000000"


def inventory() -> Inventory:
    return Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-bench", minor=i, name="NVIDIA H100 80GB HBM3",
                                    memory_mib=81920) for i in range(CARDS)),
                     levels=tuple(tuple("X" if a == b else "NV18" for b in range(CARDS)) for a in range(CARDS)))


async def run(root: Path) -> None:
    inv = inventory()
    fake = FakeNvmlNode(root / "fake", inv, mig={i: "h100-80" for i in range(CARDS)}, mig_on=tuple(range(CARDS)))
    fake.write()
    os.environ[nvml_node.ENV] = str(fake.spec)
    backend = NvmlBackend(library=str(nvml_node.library()), sysfs_root=str(root / "no-sysfs"))
    backend.inventory()
    minors = root / "mig-minors"
    minors.write_text(mig_minors_text([g.minor for g in inv.gpus]))
    state = NodeState("bench", inv, CheckpointStore(root / "ckpt"))
    manager, _ = await mig_node.start(state, backend)
    claims = MigClaims(state, manager, root / "cdi", minors, "bench")
    prep, unprep = [], []
    for n in range(ROUNDS):
        uid = f"{UID}{n:02d}"
        t0 = time.perf_counter()
        await claims.prepare("ns", "c", uid, "p", "p-uid", [MigResult("r", f"gpu-{n % CARDS}-mig-1g-10gb-19-3")])
        prep.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await claims.unprepare(uid)
        unprep.append(time.perf_counter() - t0)
    print(f"  prepare (create 1g.10gb + 2 checkpoints + CDI): {summary_ms(prep)}")
    print(f"  unprepare (destroy + checkpoint):              {summary_ms(unprep)}")
    for card in range(CARDS):
        for start in range(7):
            await asyncio.to_thread(manager.create, card, "1g.10gb", start)
    state.close()
    for label, drop_checkpoint in (("all 28 recorded", False), ("none recorded: 28 destroyed", True)):
        if drop_checkpoint:
            for f in (root / "ckpt").iterdir():
                f.unlink()
        again = NodeState("bench", inv, CheckpointStore(root / "ckpt"))
        load_checkpoint(again)
        t0 = time.perf_counter()
        _, plan = await mig_node.start(again, backend)
        took = time.perf_counter() - t0
        print(f"  reconcile {CARDS} cards x 7 instances, {label}: {took * 1000:.1f} ms "
              f"(kept {len(plan.keep)}, destroyed {len(plan.destroy)})")
        again.close()
    backend.close()


def main() -> None:
    nvml_node.build()
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(Path(d)))


if __name__ == "__main__":
    main()
