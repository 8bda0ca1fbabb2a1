"""Two pods admitted before either starts (images still pulling), their guesses swapped on a card that is full:
the kubelet checkpoint repairs both, whatever order its entries come in, and nothing held is dropped."""

from __future__ import annotations

import dataclasses
import json

import grpc
import pytest

from gpumgr.agent.reconcile import reconcile
from gpumgr.deviceplugin import ids as devids
from gpumgr.node import binding
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.requests import podspec
from gpumgr.vdevice.layout import allocation_key
from tests.e2e.harness import sim_node


@pytest.mark.parametrize("order", ["q-first", "p-first"])
@pytest.mark.parametrize("by", ["reconcile", "prestart"])
async def test_swapped_guesses_on_a_full_card_are_repaired_in_any_order(order, by):
    async with sim_node("dgx-a100", memory_mib=16384) as node:  # 64 units of 256 MiB per card
        svc, st = node.agent.service, node.agent.state
        o = node.create_pod("other", [("main", 30, 40)])
        p = node.create_pod("p", [("main", 20, 4)])
        q = node.create_pod("q", [("main", 20, 20)])  # 40 + 4 + 20 = 64 units: card 0 exactly full
        await node.kubelet.wait_for(lambda: all(svc.pods.get(x["metadata"]["uid"]) for x in (o, p, q)), 5)
        c0 = devids.core_ids(node.inventory.gpus[0])
        ids = {"o": c0[0:30], "q": c0[30:50], "p": c0[50:70]}
        keys = {k: allocation_key(v) for k, v in ids.items()}

        def cand(pod):
            return binding.Candidate(pod, binding.find_container(pod, "main"), None, ())

        def allocate(ledger):  # what three Allocates with wrong guesses leave behind
            ledger.assign(svc._allocation_for(cand(o), (0,), keys["o"], verified=True))
            ledger.assign(svc._allocation_for(cand(p), (0,), keys["q"]))  # Q's IDs guessed as P (4 units)
            ledger.assign(svc._allocation_for(cand(q), (0,), keys["p"]))  # P's IDs guessed as Q (20 units)

        await st.commit(allocate)
        entries = [(o, "o"), (q, "q"), (p, "p")] if order == "q-first" else [(o, "o"), (p, "p"), (q, "q")]
        # the kubelet's record of these three pods, in a file of its own (the emulator rewrites its own file)
        ckpt = node.workdir / "kubelet_checkpoint_for_test"
        svc.config = dataclasses.replace(svc.config, kubelet_checkpoint=ckpt)
        ckpt.write_text(json.dumps({"Data": {"PodDeviceEntries": [
            {"PodUID": pod["metadata"]["uid"], "ContainerName": "main", "ResourceName": podspec.RESOURCE_CORE,
             "DeviceIDs": {"0": list(ids[name])}} for pod, name in entries], "RegisteredDevices": {}},
            "Checksum": 1}))
        if by == "reconcile":
            report = await reconcile(svc, True, 60, "periodic")
            assert report.conflicts == []
        else:  # the first container to start settles both guesses
            async with grpc.aio.insecure_channel(f"unix://{node.config.device_plugin_dir / 'vcore.sock'}") as ch:
                await pb_grpc.DevicePluginStub(ch).PreStartContainer(
                    pb.PreStartContainerRequest(devices_ids=ids["q"]), timeout=10)
        got = {a.pod: (a.key, a.memory_mib) for a in st.ledger.allocations.values()}
        assert got == {"other": (keys["o"], 40 * 256), "p": (keys["p"], 4 * 256), "q": (keys["q"], 20 * 256)}
        assert st.ledger.cards[0].free_memory_mib == 0 and st.ledger.cards[0].free_cores == 30
