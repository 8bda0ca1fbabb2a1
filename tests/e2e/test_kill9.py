"""`kill -9` of the agent in the middle of a burst of 200 allocations, then a restart: no card double-booked,
none leaked, every admitted pod still holds its cards."""

from __future__ import annotations

import asyncio

from gpumgr.deviceplugin import ids as devids
from gpumgr.devices.spec import load_node_spec
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.requests import podspec
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet import AdmissionError, ContainerRequest, KubeletEmulator
from gpumgr.vdevice.layout import allocation_key
from tests.e2e.agent_process import process_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


async def admit(kubelet: KubeletEmulator, api: KubeApiServer, pod: dict) -> bool:
    """As the kubelet would: run the pod, or mark it Failed (UnexpectedAdmissionError) when admission fails."""
    try:
        await kubelet.admit_pod(pod["metadata"]["uid"], [ContainerRequest("main", {CORE: 4, MEM: 1})])
    except AdmissionError:
        api.store.set_pod_phase("default", pod["metadata"]["name"], "Failed")  # UnexpectedAdmissionError
        return False
    api.store.set_pod_phase("default", pod["metadata"]["name"], "Running")
    return True


async def wait_ready(kubelet: KubeletEmulator, count: int) -> None:
    for res in (CORE, MEM):
        await kubelet.wait_registered(res, timeout=30, count=count)
        await kubelet.wait_for(lambda r=res: bool(kubelet.devices(r)) and all(
            h == "Healthy" for h in kubelet.devices(r).values()), 30)


async def test_kill9_mid_burst_then_restart_loses_and_doubles_nothing():
    async with process_node("burst-node", "dgx-a100", 16384, "--check-period", "1", "--unrecorded-grace", "2") as n:
        api, kubelet, agent = n.api, n.kubelet, n.agent
        inv = load_node_spec(n.spec)
        agent.start()
        await wait_ready(kubelet, 1)
        admitted: list[dict] = []
        failed = 0
        loop = asyncio.get_running_loop()
        for i in range(200):
            pod = n.bound_pod(f"p{i}", 4, 1)
            if i == 70:  # kill while this admission is in flight
                loop.call_later(0.003, agent.kill9)
            if await admit(kubelet, api, pod):
                admitted.append(pod)
            else:
                failed += 1
                if failed == 1:
                    agent.kill9()
                    agent.start()
                    await wait_ready(kubelet, 2)
        # replace the pods whose admission failed while the agent was down
        for i in range(200 - len(admitted)):
            pod = n.bound_pod(f"r{i}", 4, 1)
            assert await admit(kubelet, api, pod), agent.logs()[-3000:]
            admitted.append(pod)
        assert failed >= 1 and len(admitted) == 200

        want: dict[str, tuple[int, ...]] = {}
        for pod in admitted:
            ids = kubelet.pod_devices(pod["metadata"]["uid"])["main"][CORE]
            want[allocation_key(ids)] = tuple(sorted(devids.cards_of(inv, ids, "c")))
        # unrecorded allocations are freed after the grace (2 s) at a reconcile (every 1 s): wait for the agent's
        # checkpoint to say so (a loaded machine needs longer than the 3 s this takes on an idle one)
        store = CheckpointStore(n.workdir / "ckpt")

        def settled() -> bool:
            ledger = store.load().snapshot.ledger
            return ({k: a.cards for k, a in ledger.allocations.items()} == want
                    and all(a.verified for a in ledger.allocations.values()))

        deadline = loop.time() + 90
        while not settled() and loop.time() < deadline:  # past it, the assertions below say what is wrong
            await asyncio.sleep(0.2)
        agent.stop()
        ledger = CheckpointStore(n.workdir / "ckpt").load().snapshot.ledger
        got = {k: a.cards for k, a in ledger.allocations.items()}
        assert got == want, f"leaked {set(got) - set(want)}, lost {set(want) - set(got)}"
        for a in ledger.allocations.values():
            assert a.verified and a.cores == 4 and a.memory_mib == 256
        for c in ledger.cards:
            held = [a for a in ledger.allocations.values() if c.index in a.cards]
            assert sum(a.cores for a in held) == 100 - c.free_cores <= 100
        assert sum(100 - c.free_cores for c in ledger.cards) == 4 * 200
