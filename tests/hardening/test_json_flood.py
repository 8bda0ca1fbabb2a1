"""Issue 18, finding 1: an AdmissionReview of 3.9 MiB holding 1.3 million empty objects (under the body limit,
three levels deep) killed the webhook under the chart's 128 MiB limit. It is refused with a 400 and a JSON error
from a scan of the bytes, before a document is built, and the webhook keeps answering within its limit.

Before the fix: OOM-killed in the cgroup (or peak RSS ~229 MiB without one); the test failed on both."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpumgr.serving.body import Limits
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


def _max_elements_body(limit_bytes: int, elements: int) -> bytes:
    """An AdmissionReview as costly to decode as the webhook admits: `elements` JSON elements, as unique keys
    mapped to empty objects (the most Python memory per element), padded to `limit_bytes` with one string."""
    pairs = elements // 2 - 64
    obj = b"{" + b",".join(b'"k%07d":{}' % i for i in range(pairs)) + b"}"
    head = json.dumps(review(pod(container("a", limits={CORE: "100"}))))[:-1].encode()
    body = head + b',"flood":' + obj + b',"pad":"'
    return body + b"x" * (limit_bytes - len(body) - 3) + b'"}'


def _slow(port: int, size: int) -> Any:
    """A connection that sends the headers and all but the last byte of a `size`-byte body, then waits."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % size)
    with contextlib.suppress(OSError):  # refused (503) and closed while we sent
        s.sendall(b" " * (size - 1))
    return s


def test_the_worst_load_the_webhook_admits_stays_within_the_charts_limit(tmp_path: Path) -> None:
    """Item 8 of issue 18: the webhook's bodies in flight fill the budget its memory limit allows (slow uploads
    of 4 MiB that never finish) while bodies of the most JSON elements it admits are decoded again and again."""
    limit = chart_memory_limit("webhook")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMGR_")}
    hook = Capped.start([sys.executable, "-m", "gpumgr.cli", "webhook", "--insecure-http", "--listen",
                         f"127.0.0.1:{port}", "--memory-limit-bytes", str(limit)], limit, tmp_path / "webhook.log",
                        env)
    body = 4 * 2**20
    heavy = _max_elements_body(body, body // 20)
    held: list[Any] = []
    try:
        hook.wait_http(f"http://127.0.0.1:{port}/healthz")
        budget = Limits(max_body_bytes=body, memory_limit_bytes=limit, json_bytes_per_element=20).budget_bytes
        held = [_slow(port, body) for _ in range(budget // body - 1)]  # all the budget but one body
        statuses = []
        for _ in range(6):  # decoded one after another in the room left
            status, doc, _ = _post(port, heavy)
            statuses.append(status)
            assert status == 200 and doc["response"]["allowed"] is True, (status, doc)
        held += [_slow(port, body) for _ in range(32)]  # and more than the budget: refused 503 at once
        assert hook.alive(), hook.output()
        good = json.dumps(review(pod(container("t", limits={CORE: "100"})))).encode()
        status, doc, _ = _post(port, good)
        assert status == 503, (status, doc)  # the budget is full: a clear refusal, the process unharmed
        peak = hook.peak_rss()
        print(f"\nwebhook {hook.where}: {budget // body - 1} slow 4 MiB uploads held (budget {budget >> 20} MiB), "
              f"6 bodies of {body // 20} JSON elements decoded beside them, 32 more uploads refused; "
              f"peak RSS {peak / 2**20:.0f} MiB (limit {limit >> 20} MiB)")
        assert peak < limit
    finally:
        for s in held:
            s.close()
        hook.close()
    assert "Traceback" not in hook.output()
