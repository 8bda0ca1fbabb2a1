"""An agent upgraded over a checkpoint of format version 1 (allocation labels as a map of strings): it starts on
that file with every holder intact, and writes the typed format from its next change on."""

from __future__ import annotations

import json

from gpumgr.node.checkpoint import CheckpointStore, decode
from tests.e2e import legacy_scenario
from tests.e2e.harness import sim_node
from tests.helpers import FIXTURES

V1 = FIXTURES / legacy_scenario.FIXTURE / "gpumgr_checkpoint.json"


async def test_the_agent_restarts_on_a_version_1_checkpoint_with_every_holder_intact():
    want = decode(V1.read_bytes(), str(V1), "sim-node").ledger.allocations
    with legacy_scenario.fixed_uids():
        async with sim_node("dgx-a100") as node:
            maybe_a, admitted = await legacy_scenario.run(node)
            await node.stop_agent()
            store = CheckpointStore(node.config.checkpoint_dir)
            store.prev.unlink(missing_ok=True)
            store.path.write_bytes(V1.read_bytes())  # the same pods, UIDs and devices as when it was written
            # the pod of the nameless allocation is bound here now (the kubelet admitted it, so it is ours)
            node.api.store.bind_pod("default", "elsewhere", node.node_name)

            await node.start_agent()
            assert node.agent is not None and node.agent.service is not None
            ledger = node.agent.state.ledger
            nameless = next(k for k, a in want.items() if a.holder is None)
            # nothing freed, restored or repaired: every holder is as it was; the nameless one may have been named
            assert {k: a for k, a in ledger.allocations.items() if k != nameless} == \
                {k: a for k, a in want.items() if k != nameless}
            kept = ledger.held_by(nameless)
            assert kept is not None and (kept.cards, kept.cores) == (want[nameless].cards, want[nameless].cores)
            assert kept.holder is None or kept.pod == "elsewhere"
            names = {(a.pod, a.container, a.verified) for a in ledger.allocations.values() if a.key != nameless}
            assert {("whole", "main", True), ("frac", "main", True), ("reuse", "main", True),
                    ("reuse", "setup", True), ("two", "first", True), ("two", "second", True),
                    ("maybe-a", "main", False), ("dra-infer", "", True)} == names
            verified = {a.key for a in ledger.allocations.values() if a.verified and a.claim is None}
            assert verified >= {a.key for a in want.values() if a.verified and a.claim is None}
            assert set(node.agent.service.vdevices.running()) == verified

            # the next change writes format version 2, with the old holders in it
            await node.start_pod(maybe_a, admitted)
            doc = json.loads(store.path.read_text())
            assert doc["version"] == 2
            again = decode(store.path.read_bytes(), str(store.path), "sim-node").ledger.allocations
            assert {k: a for k, a in again.items() if a.pod != "maybe-a" and k != nameless} == \
                {k: a for k, a in want.items() if a.pod != "maybe-a" and k != nameless}
            assert next(a for a in again.values() if a.pod == "maybe-a").verified
