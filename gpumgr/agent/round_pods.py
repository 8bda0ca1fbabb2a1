"""The node's pods for one reconcile round, shared by its two passes (the vcuda allocations, gpumgr/agent/
reconcile.py, then the device plugins' MIG holdings, gpumgr/mig/holdings.py): the pod cache listed once (a static
pod also under the UID the kubelet knows it by, its mirror pod's config.mirror), and at most one fresh list from the
API server when a holder's pod is missing from the cache (gpumgr/agent/gone.py), where each pass listed on its own.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpumgr.kube.pod_cache import mirror_of


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]: ...

    def known_finished(self, uid: str) -> bool: ...

    async def live_uids(self) -> set[str] | None: ...


class RoundPods:
    def __init__(self, source: PodSource):
        self.source = source
        by_uid = {str(p["metadata"]["uid"]): p for p in source.pods() if (p.get("metadata") or {}).get("uid")}
        for p in list(by_uid.values()):
            alias = mirror_of(p)
            if alias:
                by_uid.setdefault(alias, p)
        self.by_uid: dict[str, dict[str, Any]] = by_uid
        self._live: tuple[set[str] | None] | None = None  # the fresh list's answer, once asked

    def known_finished(self, uid: str) -> bool:
        return self.source.known_finished(uid)

    async def live_uids(self) -> set[str] | None:
        """The fresh list of the round (None when the API could not be asked: asked again next round only)."""
        if self._live is None:
            self._live = (await self.source.live_uids(),)
        return self._live[0]
