"""The pods on this node, kept current by a list + watch in a task on the agent's event loop.

Readers get the cached objects, which are never changed in place (a change replaces the whole entry); a
listener is told whenever something changed, so the agent can react (free the cards of pods that are gone).
`refresh()` does a live list, for when a pod must be seen now.

The watch resumes from the last resourceVersion it saw (events or bookmarks) when the server ends it, and lists
again only when that version has expired (410) or the watch failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumgr.kube.client import KubeClient
from gpumgr.kube.pace import BookmarkPace
from gpumgr.kube.rest import ApiError, status_error

log = logging.getLogger("gpumgr.kube")

WATCH_TIMEOUT_S = 60
TOMBSTONE_S = 600.0  # how long a deleted pod's UID is remembered
MAX_TOMBSTONES = 10_000
MAX_FAILED_RESUMES = 3  # failed watch resumes before a full list


class PodCache:
    def __init__(self, kube: KubeClient, node: str):
        self.kube = kube
        self.node = node
        self._lock = threading.Lock()  # readers may sit in other threads (metrics)
        self._pods: dict[str, dict[str, Any]] = {}
        # uid -> when the watch saw it deleted (monotonic): a UID never comes back, so an older answer naming it
        # (a slow live list) must not revive it; kept TOMBSTONE_S, at most MAX_TOMBSTONES
        self._tombstones: dict[str, float] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []
        self.lists = 0  # full lists done by the watch task (a resumed watch does none)
        self.bookmark_floods = 0  # watches ended because bookmarks came too fast (gpumgr.kube.pace)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, on_change: Callable[[], None] | None = None) -> None:
        """Start listing and watching; call inside the running event loop."""
        if on_change:
            self._listeners.append(on_change)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pod-cache")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def wait_synced(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), timeout)
        return self._synced.is_set()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    # -- reading --------------------------------------------------------------------------------------------
    def pods(self) -> list[dict[str, Any]]:
        """The cached pods. Read-only: entries are replaced whole on every change, never edited in place."""
        with self._lock:
            return list(self._pods.values())

    def get(self, uid: str) -> dict[str, Any] | None:
        """By API UID, or by the UID the kubelet knows a static pod by (its mirror pod's config.mirror)."""
        with self._lock:
            pod = self._pods.get(uid)
            if pod is None:
                pod = next((p for p in self._pods.values() if mirror_of(p) == uid), None)
            return pod

    def known_finished(self, uid: str) -> bool:
        """True when the cache itself is proof that the pod holds no devices any more: the watch saw it deleted (a
        UID never comes back), or its phase is Succeeded or Failed (phases never go back). False says nothing."""
        with self._lock:
            if uid in self._tombstones:
                return True
            pod = self._pods.get(uid)
        return pod is not None and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    async def refresh(self) -> None:
        """A live list now (the watch may lag behind a pod that was just bound here). Merged in, never replacing:
        an answer that took long may be older than what the watch has already delivered."""
        pods, list_rv = await self.kube.list_node_pods(self.node)
        self._merge(pods, list_rv)
        self._notify()

    async def live_uids(self) -> set[str] | None:
        """UIDs of the pods on this node that still hold devices (not Succeeded/Failed), from a fresh list;
        None when the API cannot be asked (then nothing should be freed on the cache's word alone)."""
        try:
            pods, list_rv = await self.kube.list_node_pods(self.node)
        except Exception as e:  # noqa: BLE001
            log.warning("cannot list the pods on node %s (%s): freeing nothing this round", self.node, e)
            return None
        self._merge(pods, list_rv)
        return {str(p["metadata"]["uid"]) for p in pods
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}

    def _merge(self, pods: list[dict[str, Any]], list_rv: str) -> None:
        """A live list merged in: newer versions replace older ones; a pod the watch saw deleted stays deleted
        (its tombstone outlives any relist, TOMBSTONE_S), however late a slow list answers."""
        with self._lock:
            for p in pods:
                self._put(p)

    # -- the watch task -------------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = 0.2
        rv = ""
        failed_resumes = 0
        while True:
            try:
                if not rv:
                    pods, rv = await self.kube.list_node_pods(self.node)
                    self.lists += 1
                    self._replace(pods, rv)
                    self._synced.set()
                began, floods = loop.time(), self.bookmark_floods
                rv = await self._watch(rv)
                failed_resumes = 0
                # a server that ends every watch at once, or floods it with bookmarks, must not be hammered
                if loop.time() - began < 1.0 or self.bookmark_floods > floods:
                    await asyncio.sleep(_jitter(backoff))
                    backoff = min(backoff * 2, 10.0)
                else:
                    backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the watch restarts on any failure
                failed_resumes += 1
                # a dropped connection resumes from the last version seen; a list (a quorum read of every pod on
                # the node) only when the version expired or resuming keeps failing
                if failed_resumes > MAX_FAILED_RESUMES or isinstance(e, ApiError):
                    rv, failed_resumes = "", 0
                log.warning("pod watch on node %s failed (%s); %s in %.1fs", self.node, e,
                            "resuming" if rv else "listing again", backoff)
                await asyncio.sleep(_jitter(backoff))
                backoff = min(backoff * 2, 10.0)

    async def _watch(self, rv: str) -> str:
        """One watch from `rv`; the version to resume from, or "" when the cache must be listed again."""
        # closed on every way out (an error, a 410), so the stream's connection goes back at once, not at GC
        pace = BookmarkPace()
        async with contextlib.aclosing(self.kube.watch_node_pods(self.node, rv, WATCH_TIMEOUT_S)) as events:
            async for ev in events:
                kind, obj = str(ev.get("type")), ev["object"]
                if kind == "ERROR":
                    err = status_error(obj)
                    if err.status == 410:
                        log.info("pod watch on node %s: resourceVersion %s expired; listing again", self.node, rv)
                        return ""
                    raise err
                seen = (obj.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    self._apply(kind, obj)
                elif not pace.allow(asyncio.get_running_loop().time()):
                    log.warning("pod watch on node %s: the API server sends bookmarks faster than %g a second "
                                "(after %d); ending this watch, resuming after a pause", self.node, pace.per_s,
                                pace.burst)
                    self.bookmark_floods += 1
                    if seen:
                        rv = str(seen)
                    return rv  # a quick end: the caller pauses (doubling) before it resumes
                if seen:
                    rv = str(seen)
        return rv

    def _replace(self, pods: list[dict[str, Any]], list_rv: str) -> None:
        """A full list from the watch thread: it replaces the cache, except for what is newer than the list."""
        snapshot = _rv(list_rv)
        with self._lock:
            old = self._pods
            self._pods = {}
            self._prune_tombstones()
            for p in pods:
                self._put(p)
            for uid, p in old.items():  # seen after the list was taken (by a refresh or the watch)
                if uid not in self._pods and _rv(p) > snapshot:
                    self._pods[uid] = p
        self._notify()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
                self._tombstones[uid] = time.monotonic()
                self._prune_tombstones()
            elif kind in ("ADDED", "MODIFIED"):
                self._put(pod)
        self._notify()

    def _put(self, pod: dict[str, Any]) -> None:
        """Keep the newest version of a pod (by resourceVersion); never revive one the watch saw deleted."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        meta.pop("managedFields", None)  # often half of a pod's bytes, never read here (the dict is ours, fresh)
        rv = _rv(pod)
        if uid in self._tombstones:  # deleted: a UID never comes back
            return
        cur = self._pods.get(uid)
        if cur is None or _rv(cur) <= rv:
            self._pods[uid] = pod

    def _prune_tombstones(self) -> None:
        """Oldest first (insertion order): drop those older than TOMBSTONE_S and any beyond MAX_TOMBSTONES."""
        cutoff = time.monotonic() - TOMBSTONE_S
        while self._tombstones:
            uid, when = next(iter(self._tombstones.items()))
            if when >= cutoff and len(self._tombstones) <= MAX_TOMBSTONES:
                break
            del self._tombstones[uid]

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("pod cache listener failed")


def _jitter(seconds: float) -> float:
    """±50 %: after an API server restart, the nodes' agents must not come back in step."""
    return seconds * random.uniform(0.5, 1.5)  # noqa: S311 - spreading retries, not security


def _rv(obj: dict[str, Any] | str) -> int:
    """A resourceVersion as a number for ordering (opaque by contract, decimal in practice); unknown is 0."""
    raw = obj if isinstance(obj, str) else (obj.get("metadata") or {}).get("resourceVersion", "")
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


MIRROR = "kubernetes.io/config.mirror"


def mirror_of(pod: dict[str, Any]) -> str | None:
    """A static pod's mirror pod carries the UID the kubelet uses for it (in its checkpoint) in this annotation."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(MIRROR)
