"""The node's per-card cordon end to end: the agent reads its Node, steers new pods off the card through
GetPreferredAllocation, keeps the pods already there, and shows it on /metric."""

from __future__ import annotations

import aiohttp

from gpumgr.requests.choices import ANN_CORDON
from tests.e2e.harness import env_of, sim_node


async def test_cordoned_card_takes_no_new_pod_and_shows_on_metric():
    async with sim_node("gtx1080ti") as node:
        g0, g1 = node.inventory.gpus[0], node.inventory.gpus[1]
        old = await node.run_pod("old", [("main", 30, 4)])
        on = env_of(old, "main")["NVIDIA_VISIBLE_DEVICES"]
        node.api.store.merge_patch_node(node.node_name, {"metadata": {"annotations": {ANN_CORDON: on}}})
        await node.agent.refresh_cordon()
        new = await node.run_pod("new", [("main", 30, 4)])  # binpack would share `old`'s card
        assert env_of(new, "main")["NVIDIA_VISIBLE_DEVICES"] == (g1.uuid if on == g0.uuid else g0.uuid)
        held = {a.pod for a in node.agent.state.ledger.allocations.values()}
        assert {"old", "new"} <= held  # the pod on the cordoned card keeps running
        async with aiohttp.ClientSession() as s, s.get(node.agent.http.url + "/metric") as r:
            text = await r.text()
        lines = [ln for ln in text.splitlines() if ln.startswith("gpumgr_gpu_cordoned{")]
        assert len(lines) == 2 and sum(ln.endswith(" 1.0") for ln in lines) == 1
        assert any(on in ln and ln.endswith(" 1.0") for ln in lines)
