"""docs/metrics.md names every metric the agent exposes (so the reference cannot silently fall behind)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.node import SimNode
from tests.metrics.scrape import get, serving

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


async def test_every_exposed_metric_is_documented(tmp_path):
    node = SimNode(tmp_path)
    await node.place("p", "c", (0,), cores=50, memory_mib=512, pids=[10])
    m = node.metrics
    m.observe_allocate(0.01, ok=False, reason="no_fit")
    m.reregistration("tencent.com/vcuda-core")
    m.health_transition(0, False, "xid")
    m.xid_error(0, 79)
    async with serving(node) as server:
        _, _, text = await get(server.url + "/metric")
    exposed = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_created") or not fam.samples:
            continue  # prometheus-client's creation timestamps
        exposed[fam.name] = fam.name + "_total" if fam.type == "counter" else fam.name
    assert len(exposed) >= 20
    doc = DOC.read_text()
    missing = sorted(shown for shown in exposed.values() if f"`{shown}`" not in doc)
    assert not missing, f"not in docs/metrics.md: {missing}"
