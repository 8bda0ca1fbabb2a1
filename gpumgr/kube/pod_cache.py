"""The pods on this node, kept current by a list + watch in a background thread.

Readers get the cached objects, which are never changed in place (a change replaces the whole entry); a
listener is told whenever something changed, so the agent can react (free the cards of pods that are gone).
`refresh()` does a live list, for when a pod must be seen now.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumgr.kube.client import KubeClient

log = logging.getLogger("gpumgr.kube")

WATCH_TIMEOUT_S = 60


class PodCache:
    def __init__(self, kube: KubeClient, node: str):
        self.kube = kube
        self.node = node
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._tombstones: dict[str, int] = {}  # uid -> resourceVersion of its deletion
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, on_change: Callable[[], None] | None = None) -> None:
        if on_change:
            self._listeners.append(on_change)
        self._thread = threading.Thread(target=self._run, name="pod-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    async def wait_synced(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._synced.wait, timeout)

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
        pods, _ = await asyncio.get_running_loop().run_in_executor(None, self.kube.list_node_pods_sync, self.node)
        with self._lock:
            for p in pods:
                self._put(p)
        self._notify()

    async def live_uids(self) -> set[str] | None:
        """UIDs of the pods on this node that still hold devices (not Succeeded/Failed), from a fresh list;
        None when the API cannot be asked (then nothing should be freed on the cache's word alone)."""
        try:
            pods, _ = await asyncio.get_running_loop().run_in_executor(None, self.kube.list_node_pods_sync,
                                                                       self.node)
        except Exception as e:  # noqa: BLE001
            log.warning("cannot list the pods on node %s (%s): freeing nothing this round", self.node, e)
            return None
        with self._lock:
            for p in pods:
                self._put(p)
        return {str(p["metadata"]["uid"]) for p in pods
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}

    # -- the watch thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        from kubernetes import watch

        backoff = 0.2
        while not self._stop.is_set():
            try:
                pods, rv = self.kube.list_node_pods_sync(self.node)
                self._replace(pods, rv)
                self._synced.set()
                backoff = 0.2
                w = watch.Watch()
                for ev in w.stream(self.kube.core.list_pod_for_all_namespaces,
                                   field_selector=f"spec.nodeName={self.node}", resource_version=rv,
                                   timeout_seconds=WATCH_TIMEOUT_S, _request_timeout=WATCH_TIMEOUT_S + 15):
                    if self._stop.is_set():
                        w.stop()
                        break
                    self._apply(str(ev.get("type")), self.kube.to_dict(ev["object"]))
            except Exception as e:  # noqa: BLE001 - the watch restarts on any failure
                if self._stop.is_set():
                    break
                log.warning("pod watch on node %s failed (%s); listing again in %.1fs", self.node, e, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    def _replace(self, pods: list[dict[str, Any]], list_rv: str) -> None:
        """A full list from the watch thread: it replaces the cache, except for what is newer than the list."""
        snapshot = _rv(list_rv)
        with self._lock:
            old = self._pods
            self._pods = {}
            self._tombstones = {u: rv for u, rv in self._tombstones.items() if rv > snapshot}
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
                self._tombstones[uid] = _rv(pod)
            elif kind in ("ADDED", "MODIFIED"):
                self._put(pod)
        self._notify()

    def _put(self, pod: dict[str, Any]) -> None:
        """Keep the newest version of a pod (by resourceVersion); never revive one the watch saw deleted."""
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return
        rv = _rv(pod)
        if self._tombstones.get(uid, -1) >= rv:
            return
        cur = self._pods.get(uid)
        if cur is None or _rv(cur) <= rv:
            self._pods[uid] = pod

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("pod cache listener failed")


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
