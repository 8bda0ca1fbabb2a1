"""The extender's choice is what the node gives: scheduler → extender filter/prioritize/bind → kubelet
emulator → agent Allocate, over HTTP and unix-socket gRPC."""

from __future__ import annotations

from gpumgr.extender.server import ExtenderServer
from gpumgr.requests import podspec
from gpumgr.sim.scheduler import SchedulerEmulator
from tests.e2e.harness import env_of, sim_node

CORE = podspec.RESOURCE_CORE


async def test_extender_bind_then_kubelet_allocate_gives_the_same_cards():
    async with sim_node("baobab") as node:
        ext = ExtenderServer(str(node.kubeconfig), policy="binpack", insecure=True,
                             scheduler_name="default-scheduler")
        port = await ext.start("127.0.0.1", 0)
        try:
            await ext.wait_ready(30)
            await node.kubelet.wait_for(lambda: node.node_name in ext.view.nodes, 30)
            sched = SchedulerEmulator(f"http://127.0.0.1:{port}/gpumgr")
            asks = [("a", [("main", 30, 8)]), ("b", [("main", 30, 8)]), ("c", [("main", 200, 0)]),
                    ("d", [("x", 20, 4), ("y", 100, 0)]), ("e", [("main", 40, 8)])]
            for name, containers in asks:
                pod = node.create_pod(name, containers, bind=False)
                decision = await sched.schedule(pod, [node.node_name])
                assert decision.node == node.node_name, decision.reasons
                bound = node.pod(name)
                ann = podspec.pod_annotations(bound)
                assert ann[podspec.ANN_PREDICATE_NODE] == node.node_name and ann[podspec.ANN_ASSIGNED] == "false"
                admitted = await node.admit(bound)
                for i, (cname, _, _) in enumerate(containers):
                    uuids = env_of(admitted, cname)["NVIDIA_VISIBLE_DEVICES"].split(",")
                    minors = sorted(node.inventory.by_uuid(u).minor for u in uuids)
                    recorded = sorted(int(m) for m in ann[f"tencent.com/predicate-gpu-idx-{i}"].split(","))
                    assert minors == recorded, (name, cname, minors, recorded)
            ledger = node.agent.state.ledger
            assert all(a.verified for a in ledger.allocations.values())
            assert len(ledger.allocations) == 6
        finally:
            await ext.stop()
