"""Issue 18, finding 1: an AdmissionReview of 3.9 MiB holding 1.3 million empty objects (under the body limit,
three levels deep) killed the webhook under the chart's 128 MiB limit. It is refused with a 400 and a JSON error
from a scan of the bytes, before a document is built, and the webhook keeps answering within its limit.

Before the fix: OOM-killed in the cgroup (or peak RSS ~229 MiB without one); the test failed on both."""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.hardening.memcap import Capped, chart_memory_limit
from tests.webhook.reviews import CORE, container, pod, review

ATTACKERS = 4  # at once, as in the finding


def flood_body(objects: int = 1_300_000) -> bytes:
    """An AdmissionReview whose object is one array of `objects` empty objects (~3 bytes each)."""
    head = json.dumps(review(pod(container("a", limits={CORE: "100"}))))[:-1].encode()
    return head + b',"flood":{"x":[' + b",".join([b"{}"] * objects) + b"]}}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, body: bytes) -> tuple[int, Any, float]:
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), time.monotonic() - t0
    finally:
        conn.close()


def test_a_million_empty_objects_are_refused_within_the_charts_memory_limit(tmp_path: Path) -> None:
    body = flood_body()
    assert 3.5 * 2**20 < len(body) < 4 * 2**20  # under the webhook's 4 MiB body limit
    limit = chart_memory_limit("webhook")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMGR_")}
    hook = Capped.start([sys.executable, "-m", "gpumgr.cli", "webhook", "--insecure-http", "--listen",
                         f"127.0.0.1:{port}"], limit, tmp_path / "webhook.log", env)
    try:
        hook.wait_http(f"http://127.0.0.1:{port}/healthz")
        with ThreadPoolExecutor(ATTACKERS) as pool:
            answers = list(pool.map(lambda _: _post(port, body), range(ATTACKERS)))
        for status, doc, _ in answers:
            assert status == 400, (status, doc)
            assert set(doc) == {"error"} and "at most" in doc["error"], doc
        good = json.dumps(review(pod(container("t", limits={CORE: "100"})))).encode()
        status, doc, _ = _post(port, good)
        assert status == 200 and doc["response"]["allowed"] is True, doc
        assert hook.alive(), hook.output()
        peak = hook.peak_rss()
        print(f"\nwebhook {hook.where}: {ATTACKERS} x {len(body) / 2**20:.1f} MiB of empty objects refused; "
              f"peak RSS {peak / 2**20:.0f} MiB (limit {limit >> 20} MiB); "
              f"slowest refusal {max(a[2] for a in answers):.2f} s")
        assert peak < limit
    finally:
        hook.close()
    assert "Traceback" not in hook.output()
