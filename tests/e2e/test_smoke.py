from __future__ import annotations

from tests.e2e.harness import env_of, mounts_of, sim_node


async def test_whole_and_fractional_pods():
    async with sim_node() as node:
        a = await node.run_pod("whole", [("main", 200, 0)])
        b = await node.run_pod("frac", [("main", 30, 16)])
        assert len(env_of(a, "main")["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2
        assert "LD_PRELOAD" in env_of(b, "main")
        vdir = mounts_of(b, "main")["/etc/vcuda"]
        print(open(vdir + "/limits").read())
        assert node.agent and node.agent.state
        print(node.agent.state.ledger.to_json())
