"""Scraping the agent over real HTTP and reading the answer with prometheus-client's own parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpumgr.metrics import MetricsServer, build_app, start_http
from tests.metrics.node import SimNode

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@asynccontextmanager
async def serving(node: SimNode, ready: Any = lambda: True, **reader_args: Any) -> AsyncIterator[MetricsServer]:
    app = build_app(node.metrics, node.reader(**reader_args), ready=ready)
    server = await start_http(app, "127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def scrape(server: MetricsServer, path: str = "/metric") -> Samples:
    status, ctype, text = await get(server.url + path)
    assert status == 200, text
    assert ctype.startswith("text/plain"), ctype
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels`."""
    want = set(labels.items())
    hits = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


def absent(samples: Samples, name: str, **labels: str) -> bool:
    want = set(labels.items())
    return not any(n == name and want <= lab for (n, lab) in samples)
