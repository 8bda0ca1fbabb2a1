"""The admission webhook over HTTPS: reviews per second and latency, as the API server calls it (keep-alive,
a few concurrent callers), for a GPU pod (patched), a plain pod (allowed as is) and an impossible ask (refused)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.bench.stats import Progress, summary_ms
from tests.webhook.conftest import client_context, make_cert
from tests.webhook.reviews import CORE, MEMORY, container, pod, review

ROUNDS = 3000
CALLERS = 4


async def run(tmp: Path) -> None:
    from gpumgr.webhook.server import TlsFiles, WebhookServer

    certs = make_cert(tmp, "server")
    server = WebhookServer("gpumgr-scheduler", TlsFiles(str(certs.cert), str(certs.key)))
    port = await server.start("127.0.0.1", 0)
    bodies = {
        "GPU pod, patched": json.dumps(review(pod(container("t", limits={CORE: "50", MEMORY: "8"})))).encode(),
        "plain pod, allowed": json.dumps(review(pod(container("web", limits={"cpu": "1"})))).encode(),
        "150 cores, refused": json.dumps(review(pod(container("t", limits={CORE: "150"})))).encode(),
    }
    try:
        connector = aiohttp.TCPConnector(ssl=client_context(certs.cert), limit=CALLERS)
        async with aiohttp.ClientSession(connector=connector) as http:
            for label, body in bodies.items():
                samples: list[float] = []
                progress = Progress(label, total=ROUNDS)

                async def caller(n: int, body: bytes = body, samples: list[float] = samples,
                                 progress: Progress = progress) -> None:
                    for _ in range(n):
                        t0 = time.perf_counter()
                        async with http.post(f"https://127.0.0.1:{port}/mutate", data=body) as r:
                            await r.read()
                            assert r.status == 200
                        samples.append(time.perf_counter() - t0)
                        progress.tick()

                t0 = time.perf_counter()
                await asyncio.gather(*(caller(ROUNDS // CALLERS) for _ in range(CALLERS)))
                wall = time.perf_counter() - t0
                print(f"  {label:20s} {len(samples) / wall:7.0f} reviews/s with {CALLERS} callers; "
                      f"{summary_ms(samples)}")
    finally:
        await server.stop()


def main() -> None:
    print(f"Admission reviews over HTTPS (TLS 1.2+, keep-alive), {ROUNDS} per kind:")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp)))


if __name__ == "__main__":
    main()
