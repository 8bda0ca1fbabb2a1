"""A kube-scheduler stand-in that drives an extender the way kube-scheduler does: POST `<prefix>/filter` and
`<prefix>/prioritize` with `ExtenderArgs` (`NodeNames`, nodeCacheCapable), pick the highest score, then POST
`<prefix>/bind` with `ExtenderBindingArgs`. Used by the demo and the end-to-end tests.

Over HTTPS it presents a client certificate as kube-scheduler does with `enableHTTPS: true` and `tlsConfig`
(certFile, keyFile, caFile): pass `tls=gpumgr.serving.tls.client_context(ca, cert, key)`."""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


class SchedulerEmulator:
    def __init__(self, extender_url: str, timeout_s: float = 30.0, tls: ssl.SSLContext | None = None):
        self.url = extender_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.tls = tls

    async def _post(self, session: aiohttp.ClientSession, verb: str, body: Mapping[str, Any]) -> Any:
        async with session.post(f"{self.url}/{verb}", json=body) as resp:
            if resp.status != 200:
                raise SchedulingError(f"extender {verb} answered HTTP {resp.status}: {await resp.text()}")
            return await resp.json()

    async def schedule(self, pod: Mapping[str, Any], nodes: Sequence[str]) -> Decision:
        """Filter, prioritize and bind one pod; the decision says where, or why nowhere."""
        meta = pod["metadata"]
        connector = aiohttp.TCPConnector(ssl=self.tls if self.tls is not None else True)
        async with aiohttp.ClientSession(timeout=self.timeout, connector=connector) as session:
            filtered = await self._post(session, "filter", {"Pod": pod, "NodeNames": list(nodes), "Nodes": None})
            if filtered.get("Error"):
                return Decision(node=None, reasons={"*": filtered["Error"]})
            fits = list(filtered.get("NodeNames") or [])
            reasons = {**(filtered.get("FailedNodes") or {}), **(filtered.get("FailedAndUnresolvableNodes") or {})}
            if not fits:
                return Decision(node=None, reasons=reasons)
            scores = await self._post(session, "prioritize", {"Pod": pod, "NodeNames": fits, "Nodes": None})
            by_node = {s["Host"]: int(s["Score"]) for s in scores or []}
            node = max(fits, key=lambda n: (by_node.get(n, 0), -fits.index(n)))
            bound = await self._post(session, "bind", {"PodName": meta["name"], "PodNamespace": meta.get(
                "namespace", "default"), "PodUID": meta.get("uid", ""), "Node": node})
            if bound.get("Error"):
                return Decision(node=None, reasons={node: f"bind failed: {bound['Error']}"}, scores=by_node)
            return Decision(node=node, reasons=reasons, scores=by_node)


class SchedulingError(Exception):
    pass


@dataclass(frozen=True)
class Decision:
    node: str | None
    reasons: dict[str, str] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)
