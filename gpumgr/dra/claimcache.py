"""The ResourceClaims allocated to this driver's pool, kept current by a list + watch, for listing.

NodePrepareResources does not use it: an allocation can change under one UID (deallocated, then allocated
again), and a watch may lag, so prepare always reads the claim from the API (one GET). The watch runs in a
thread (the `kubernetes` client blocks) and hands events to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
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

    def claims(self) -> list[Obj]:
        """The claims allocated to this pool, as the watch last saw them (for listing and recovery checks).
        Never the answer to a prepare: a claim can be deallocated and allocated again under the same UID, and
        a lagging watch would still show the old allocation; prepare reads the claim from the API."""
        return list(self._claims.values())


class _Expired(Exception):
    pass
