"""Issue 18, finding 3: sixteen uploads that never send their last byte OOM-killed the extender under the chart's
512 MiB limit with --max-body-bytes 32 MiB (peak 529 MiB). The bodies in flight are now held to 3/8 of the memory
limit the chart hands the process (--memory-limit-bytes), less the peak of one body being decoded: the uploads over
it are answered 503 at once, the extender keeps serving, and its memory stays under the limit (24 MiB bodies here:
32 MiB no longer fits in 512 MiB and is refused at start, tests/chart/test_chart_body_budget.py).

Before the fix `gpumgr extender` had no --memory-limit-bytes (exit 2) and read all sixteen bodies at once."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp

from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, free_port, inventory, node, pod
from tests.hardening.memcap import Capped, chart_memory_limit

UPLOADS = 16
BODY = 24 * 1024 * 1024
CHUNK = 1 << 20


async def _slow_upload(port: int, hold: float) -> int:
    """POST a filter body of BODY bytes, all but the last byte; the HTTP status answered, or 0 if none in `hold` s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST /gpumgr/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {BODY}\r\n\r\n".encode())
        sent = 0
        answer = asyncio.ensure_future(reader.readline())
        while sent < BODY - 1 and not answer.done():
            n = min(CHUNK, BODY - 1 - sent)
            writer.write(b" " * n)
            try:
                await writer.drain()
            except ConnectionError:
                break
            sent += n
        try:
            line = await asyncio.wait_for(answer, hold)
        except TimeoutError:
            return 0
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else -1
    finally:
        writer.close()


async def test_sixteen_slow_uploads_stay_within_the_charts_memory_limit(tmp_path: Path) -> None:
    limit = chart_memory_limit("extender")
    async with KubeApiServer() as api:
        for i in range(4):
            api.store.create_node(node(f"n{i}", inventory(2)))
        p = api.store.create_pod(pod("p", [(30, 4)]))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMGR_")}
        ext = Capped.start([sys.executable, "-m", "gpumgr.cli", "extender", "--listen", f"127.0.0.1:{port}",
                            "--kubeconfig", str(kubeconfig), "--insecure-serve-without-auth",
                            "--max-body-bytes", str(BODY), "--memory-limit-bytes", str(limit),
                            "--body-timeout", "60"], limit, tmp_path / "extender.log", env)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                for _ in range(600):
                    assert ext.alive(), ext.output()
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
                statuses = await asyncio.gather(*(_slow_upload(port, 15.0) for _ in range(UPLOADS)))
                assert ext.alive(), ext.output()
                async with http.post(f"http://127.0.0.1:{port}/gpumgr/filter", json=args(p, ["n0", "n1"])) as r:
                    assert r.status == 200
                    assert json.loads(await r.read())["NodeNames"] == ["n0", "n1"]
            refused = statuses.count(503)
            held = statuses.count(0)  # still being read: within the budget
            peak = ext.peak_rss()
            print(f"\nextender {ext.where}: {UPLOADS} uploads of {BODY >> 20} MiB never finished: {held} read, "
                  f"{refused} refused 503; peak RSS {peak / 2**20:.0f} MiB (limit {limit >> 20} MiB)")
            assert refused + held == UPLOADS, statuses
            assert 1 <= held <= 2 and refused >= UPLOADS - 2, statuses  # 3/8 of 512 MiB less 6.2 x 24 MiB: one body
            assert peak < limit
        finally:
            ext.close()
        assert "Traceback" not in ext.output()
