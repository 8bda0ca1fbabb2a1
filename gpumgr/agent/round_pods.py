"""The node's pods for one reconcile round, shared by its two passes (the vcuda allocations, gpumgr/agent/
reconcile.py, then the device plugins' MIG holdings, gpumgr/mig/holdings.py): the pod cache listed once (a static
pod also under the UID the kubelet knows it by, its mirror pod's config.mirror), and at most one fresh list from the
API server when a holder's pod is missing from the cache (gpumgr/agent/gone.py), where each pass listed on its own.

The fresh list is only the word on holdings that were in the ledger when the round began (`predates`): a holding
made later, during the first pass, may be for a pod bound after that list, which would then look gone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpumgr.allocator import Allocation
from gpumgr.kube.pod_cache import mirror_of


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]: ...

    def known_finished(self, uid: str) -> bool: ...

    async def live_uids(self) -> set[str] | None: ...


class RoundPods:
    def __init__(self, source: PodSource, held: Mapping[str, Allocation] | None = None):
        """`held`: the ledger's allocations as the round begins (None: whatever a pass reads was read before)."""
        self.source = source
        self.held = dict(held) if held is not None else None  # read before the pods: their pods were bound by then
        by_uid = {str(p["metadata"]["uid"]): p for p in source.pods() if (p.get("metadata") or {}).get("uid")}
        for p in list(by_uid.values()):
            alias = mirror_of(p)
            if alias:
                by_uid.setdefault(alias, p)
        self.by_uid: dict[str, dict[str, Any]] = by_uid
        self._live: tuple[set[str] | None] | None = None  # the fresh list's answer, once asked

    def predates(self, a: Allocation) -> bool:
        """Whether the round's pods may judge `a`: it was held, as it is, when the round began."""
        return self.held is None or self.held.get(a.key) is a

    def known_finished(self, uid: str) -> bool:
        return self.source.known_finished(uid)

    async def live_uids(self) -> set[str] | None:
        """The fresh list of the round (None when the API could not be asked: asked again next round only)."""
        if self._live is None:
            self._live = (await self.source.live_uids(),)
        return self._live[0]
