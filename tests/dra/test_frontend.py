"""`start_dra(agent)`: the one entry point the agent calls, taking what it needs from the Agent object."""

from __future__ import annotations

from types import SimpleNamespace

from gpumgr.agent.config import AgentConfig
from gpumgr.dra.config import DRIVER_NAME
from gpumgr.dra.frontend import start_dra
from tests.dra.harness import NODE, NS, DraNode, share_request


async def test_start_dra_from_an_agent_object(node: DraNode):
    await node.stop_agent()
    root = node.root
    cfg = AgentConfig(node_name=NODE, shim_dir=str(root / "shim"), dev_root=root / "dev",
                      extra={"mode": "dra", "cdi_dir": str(root / "cdi"),
                             "dra_plugin_dir": str(root / "plugins" / DRIVER_NAME),
                             "plugins_registry_dir": str(root / "registry")})
    from gpumgr.node.checkpoint import CheckpointStore
    from gpumgr.node.state import NodeState
    from gpumgr.vdevice.server import VDeviceManager

    state = NodeState(NODE, node.inventory, CheckpointStore(root / "ckpt"))
    vdevices = VDeviceManager(node.layout)
    agent = SimpleNamespace(config=cfg, state=state, kube=SimpleNamespace(api_client=node.api_client),
                            layout=node.layout, vdevices=vdevices)
    fe = await start_dra(agent)
    try:
        assert fe.cfg.socket == root / "plugins" / DRIVER_NAME / "dra.sock"
        assert fe.cfg.driver_dir == str(root / "shim" / "driver")
        await node.kubelet.wait_driver(DRIVER_NAME, after=node.kubelet.registrations)
        node.create_claim("c", [share_request()])
        running = await node.run_pod("p", {"gpu": {"resourceClaimName": "c"}})
        assert running.containers["main"].mount_source("/usr/local/nvidia/lib64") == str(root / "shim" / "driver")
        assert [k for k in state.ledger.allocations] == [f"dra/{node.claim('c')['metadata']['uid']}/0"]
        assert node.api.store.get_pod(NS, "p")["spec"]["nodeName"] == NODE
    finally:
        await fe.stop()
        await vdevices.stop_all()
        state.close()
