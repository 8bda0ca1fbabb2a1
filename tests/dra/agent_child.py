"""The DRA front end alone in a process (for kill -9 tests): `python -m tests.dra.agent_child ROOT KUBECONFIG`.
Prints `ready` once serving."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kubernetes import config

from gpumgr.dra.frontend import DraFrontEnd
from gpumgr.dra.kubeaccess import DraKube
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from gpumgr.vdevice.server import VDeviceManager
from tests.dra.harness import NODE, DraNode, inventory


async def main(root: Path, kubeconfig: str) -> None:
    template = DraNode(root)  # for its paths and config only
    store = CheckpointStore(root / "ckpt")
    state = NodeState(NODE, inventory(), store)
    loaded = store.load().snapshot
    if loaded is not None:
        state.ledger = loaded.ledger
    api_client = config.new_client_from_config(config_file=kubeconfig)
    fe = DraFrontEnd(template.cfg, state, template.layout, VDeviceManager(template.layout), DraKube(api_client))
    await fe.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
