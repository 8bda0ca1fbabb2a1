"""Whether a holder's pod is gone: the watch's own word (it saw the pod deleted, or Succeeded/Failed) is final; a
pod merely missing from the cache (which can lag or be stale) is gone only when one fresh list of the node's pods
confirms it. One rule for reconcile and for Allocate's search for holders the kubelet has let go."""

from __future__ import annotations

from typing import Protocol, TypeVar

T = TypeVar("T")


class PodView(Protocol):
    def known_finished(self, uid: str) -> bool: ...

    async def live_uids(self) -> set[str] | None: ...


async def gone(pods: PodView, held: list[tuple[T, str]]) -> list[T]:
    """Of `held` ((what, pod UID) pairs; an empty UID: a holder nobody was named for), what no live pod holds. No
    fresh list to be had: only what the watch is sure of."""
    certain = [x for x, uid in held if uid and pods.known_finished(uid)]
    unsure = [(x, uid) for x, uid in held if not (uid and pods.known_finished(uid))]
    if not unsure:
        return certain
    live = await pods.live_uids()
    if live is None:
        return certain
    return certain + [x for x, uid in unsure if uid not in live]
