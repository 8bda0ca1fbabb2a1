"""The ResourceClaims allocated to this driver's pool, kept current by a list + watch, so that
NodePrepareResources rarely waits for a GET.

Only a claim that is allocated here, reserved for a pod and has the UID the kubelet named is answered from the
cache (an allocation never changes once written); anything else is read from the API. The watch runs in a
thread (the `kubernetes` client blocks) and hands events to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gpumgr.dra.kubeaccess import DraKube

log = logging.getLogger("gpumgr.dra.claims")
Obj = dict[str, Any]
WATCH_S = 300
RETRY_S = 1.0
MAX_CLAIMS = 20_000  # a node holds at most a few hundred; a bound against a flood of matching claims


class ClaimCache:
    def __init__(self, kube: DraKube, driver: str, pool: str):
        self.kube = kube
        self.driver = driver
        self.pool = pool
        self._claims: dict[tuple[str, str], Obj] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = asyncio.Event()
        self.hits = 0
        self.misses = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, args=(loop,), name="dra-claim-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def ours(self, claim: Mapping[str, Any]) -> bool:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        return any(isinstance(r, dict) and r.get("driver") == self.driver and r.get("pool") == self.pool
                   for r in results)

    def _apply(self, kind: str, claim: Obj) -> None:
        meta = claim.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if kind == "DELETED" or not self.ours(claim):
            self._claims.pop(key, None)
        elif key in self._claims or len(self._claims) < MAX_CLAIMS:
            self._claims[key] = claim

    def _reset(self, claims: list[Obj]) -> None:
        self._claims.clear()
        for c in claims:
            self._apply("ADDED", c)
        self.synced.set()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self._stop.is_set():
            try:
                items, rv = self.kube.list_claims_sync()
                loop.call_soon_threadsafe(self._reset, items)
                while not self._stop.is_set():
                    for event in self.kube.watch_claims_sync(rv, WATCH_S):
                        if self._stop.is_set():
                            return
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise _Expired(str(obj.get("message", "")))
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            loop.call_soon_threadsafe(self._apply, kind, obj)
            except _Expired:
                continue  # list again
            except RuntimeError:  # the event loop is closed: the agent is gone
                return
            except Exception as e:  # noqa: BLE001 - keep trying; prepare falls back to GET meanwhile
                log.debug("ResourceClaim watch failed: %s", e)
                self._stop.wait(RETRY_S)

    async def get(self, namespace: str, name: str, uid: str, fetch: Callable[[str, str], Awaitable[Obj | None]]) \
            -> Obj | None:
        """The claim, from the cache when it is certainly the allocated one the kubelet means, else the API."""
        cached = self._claims.get((namespace, name))
        if cached is not None and (cached.get("metadata") or {}).get("uid") == uid \
                and (cached.get("status") or {}).get("reservedFor"):
            self.hits += 1
            return cached
        self.misses += 1
        return await fetch(namespace, name)


class _Expired(Exception):
    pass
