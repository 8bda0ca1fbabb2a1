"""`gpumgr run` meets a hostile checkpoint: it skips that generation, loads `.prev`, and keeps running.

The agent is a real process (`gpumgr run --simulate`) against the test API server and the kubelet emulator.
"""

from __future__ import annotations

import asyncio

import pytest

from gpumgr.allocator import Ledger
from gpumgr.node.checkpoint import FILE_NAME, CheckpointStore
from tests.e2e.agent_process import process_node

pytestmark = pytest.mark.asyncio


async def wait_for_log(node, words: str, limit_s: float = 60.0) -> str:
    """The agent's log once it contains `words` (or once the agent has exited, or after `limit_s`)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while loop.time() < end:
        text = node.agent.logs()
        if words in text or (node.agent.proc and node.agent.proc.poll() is not None):
            return text
        await asyncio.sleep(0.1)
    return node.agent.logs()


@pytest.mark.parametrize("current", ["deep", "generation"])
async def test_the_agent_falls_back_to_prev_when_the_current_checkpoint_is_hostile(current):
    async with process_node("ckpt-node", "dgx-a100", 16384) as n:
        store = CheckpointStore(n.workdir / "ckpt")
        store.save(Ledger([16384] * 8), node="ckpt-node")
        store.save(Ledger([16384] * 8), node="ckpt-node")
        if current == "deep":
            store.path.write_text("[" * 200_000 + "]" * 200_000)  # 400 KB
        else:
            import json

            from gpumgr.node.checkpoint import checksum

            doc = json.loads(store.path.read_text())
            doc.pop("checksum")
            doc["generation"] = "x"
            store.path.write_text(json.dumps({**doc, "checksum": checksum(doc)}))
        n.agent.start()
        logs = await wait_for_log(n, f"loaded from {store.dir / FILE_NAME}.prev")
        assert n.agent.proc is not None and n.agent.proc.poll() is None, logs[-3000:]
        assert f"checkpoint generation 1 loaded from {store.prev}" in logs
        assert f"checkpoint skipped: {store.path}" in logs and "Traceback" not in logs
