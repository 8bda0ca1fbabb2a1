"""The state of the simulated cluster: objects, the global resourceVersion, the event history and watchers.

One lock guards everything, so every write is atomic and bumps one global, strictly increasing
resourceVersion, and watchers see events in resourceVersion order. Stored objects are never changed in
place (each write stores a new dict), so readers may serialise what they get without copying.

The store is thread-safe: the HTTP server uses it from its event loop, tests and the demo use the
"direct" methods (`create_pod`, `set_pod_phase`, ...) from any thread without an HTTP round trip. Those
return deep copies and bypass the API rules that only apply to clients (status is kept on create, spec
changes are allowed).
"""

from __future__ import annotations

import collections
import copy
import datetime
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumgr.sim.kubeapi import objects
from gpumgr.sim.kubeapi.errors import already_exists, conflict, gone, invalid, not_found, stale
from gpumgr.sim.kubeapi.patch import merge_patch
from gpumgr.sim.kubeapi.selectors import ObjectFilter

Obj = dict[str, Any]
Notify = Callable[["WatchEvent | None"], None]
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

DEFAULT_HISTORY = 10_000


class KubeStore:
    """Pods, nodes and events of one simulated cluster; shared by the HTTP server and in-process callers."""

    def __init__(self, history_size: int = DEFAULT_HISTORY) -> None:
        if history_size < 1:
            raise ValueError("history_size must be at least 1")
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {k: {} for k in objects.resource_kinds()}
        self._history: collections.deque[WatchEvent] = collections.deque()
        self._history_size = history_size
        self._compacted_rv = 0
        self._subscribers: dict[int, tuple[str, Notify]] = {}
        self._next_subscriber = 0
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()
        # A test hook: resource plural -> seconds every HTTP request for it waits before it is served (a slow
        # API server, as one client sees it); the in-process methods are not slowed.
        self.latency: dict[str, float] = {}
        # A test hook: resource plural -> an asyncio.Event (of the server's loop) every HTTP request for it waits
        # for before it is served (held until the test sets it).
        self.gates: dict[str, Any] = {}

    # ---- reads -------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def get(self, resource: str, namespace: str | None, name: str) -> Obj:
        """The stored object (do not modify it). Raises a NotFound ApiError."""
        with self._lock:
            obj = self._objects[resource].get((namespace or "", name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    def list_objects(self, resource: str, flt: ObjectFilter) -> tuple[list[Obj], int]:
        """Matching stored objects sorted by namespace and name, and the resourceVersion of the snapshot."""
        with self._lock:
            items = [obj for key, obj in sorted(self._objects[resource].items()) if flt.matches(obj)]
            return items, self._rv

    # ---- writes with the rules of the API --------------------------------------------------------------

    def create(self, resource: str, namespace: str | None, body: Obj) -> Obj:
        kind = objects.resource_kinds()[resource]
        obj = objects.prepare_create(kind, objects.decode_body(kind, body), namespace, uid=str(uuid.uuid4()),
                                     now=_now(), name_suffix=_suffix())
        return self._insert(resource, obj)

    def _insert(self, resource: str, obj: Obj) -> Obj:
        with self._lock:
            key = _key(obj)
            if key in self._objects[resource]:
                raise already_exists(resource, key[1])
            return self._commit(resource, key, "ADDED", obj, None)

    def replace(self, resource: str, namespace: str | None, name: str, body: Obj, *,
                status_only: bool = False) -> Obj:
        kind = objects.resource_kinds()[resource]
        body = objects.decode_body(kind, body)
        with self._lock:
            old = self.get(resource, namespace, name)
            self._check_precondition(resource, old, body)
            new = objects.prepare_update(kind, old, body, status_only=status_only)
            return self._commit(resource, _key(old), "MODIFIED", new, old)

    def patch(self, resource: str, namespace: str | None, name: str, apply: Callable[[Obj], Obj], *,
              status_only: bool = False) -> Obj:
        """Apply `apply` (a patch function that may raise ApiError) to the current object atomically."""
        kind = objects.resource_kinds()[resource]
        with self._lock:
            old = self.get(resource, namespace, name)
            patched = apply(copy.deepcopy(old))
            if not isinstance(patched, dict):
                raise invalid(resource, name, "the patch does not produce an object")
            objects.check_metadata_types(patched)
            self._check_precondition(resource, old, patched)
            new = objects.prepare_update(kind, old, patched, status_only=status_only)
            return self._commit(resource, _key(old), "MODIFIED", new, old)

    def delete(self, resource: str, namespace: str | None, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> Obj:
        """Remove at once (grace periods are ignored); returns the object as deleted."""
        with self._lock:
            old = self.get(resource, namespace, name)
            meta = old["metadata"]
            if uid and uid != meta["uid"]:
                raise conflict(resource, name, f"Precondition failed: UID in precondition: {uid}, UID in "
                               f"object meta: {meta['uid']}")
            if resource_version and resource_version != meta["resourceVersion"]:
                raise conflict(resource, name, "Precondition failed: ResourceVersion in precondition: "
                               f"{resource_version}, ResourceVersion in object meta: "
                               f"{meta['resourceVersion']}")
            return self._commit(resource, _key(old), "DELETED", copy.deepcopy(old), old)

    def delete_collection(self, resource: str, flt: ObjectFilter) -> list[Obj]:
        """Remove every object that matches `flt`, each with its own DELETED event."""
        with self._lock:
            doomed = [key for key, obj in sorted(self._objects[resource].items()) if flt.matches(obj)]
            return [self._commit(resource, key, "DELETED", copy.deepcopy(self._objects[resource][key]),
                                 self._objects[resource][key]) for key in doomed]

    def bind(self, namespace: str, name: str, node: str, *, uid: str | None = None,
             annotations: dict[str, str] | None = None, resource_version: str | None = None) -> Obj:
        """Set a pending pod's `spec.nodeName` (409 when it is already bound, 404 when missing). `uid` and
        `resource_version` are preconditions, as the Binding's metadata makes them (BindingREST's
        setPodHostAndAnnotations): 409 Conflict when the pod's differ."""
        with self._lock:
            old = self.get("pods", namespace, name)
            if uid and uid != old["metadata"]["uid"]:
                raise conflict("pods", name, f"Precondition failed: UID in precondition: {uid}, "
                               f"UID in object meta: {old['metadata']['uid']}")
            if resource_version and resource_version != old["metadata"]["resourceVersion"]:
                raise conflict("pods", name, "Precondition failed: ResourceVersion in precondition: "
                               f"{resource_version}, ResourceVersion in object meta: "
                               f"{old['metadata']['resourceVersion']}")
            if old["metadata"].get("deletionTimestamp"):
                raise conflict("pods", name, "pod is being deleted, cannot be assigned to a host")
            current = (old.get("spec") or {}).get("nodeName")
            if current:
                raise conflict("pods", name, f"pod {name} is already assigned to node \"{current}\"")
            new = objects.bind(old, node, annotations or {}, _now())
            return self._commit("pods", _key(old), "MODIFIED", new, old)

    # ---- watch -----------------------------------------------------------------------------------------

    def subscribe(self, resource: str, since: int | None,
                  notify: Notify) -> tuple[list[WatchEvent], int, int]:
        """Start delivering `resource` events to `notify` (called under the store lock; must not block).

        Returns the events to send first, the resourceVersion they bring the watcher to, and a token for
        `unsubscribe`. With `since` None the first events are synthetic ADDED events for every current
        object; otherwise the history after `since`, or a 410 Expired ApiError when it is compacted.
        """
        with self._lock:
            if since is None:
                first = [WatchEvent(self._rv, "ADDED", obj, None)
                         for _, obj in sorted(self._objects[resource].items())]
            elif since < self._compacted_rv:
                raise gone(f"too old resource version: {since} ({self._compacted_rv + 1})")
            else:
                first = [ev for ev in self._history if ev.rv > since and ev.resource == resource]
            token = self._next_subscriber
            self._next_subscriber += 1
            self._subscribers[token] = (resource, notify)
            return first, self._rv, token

    def unsubscribe(self, token: int) -> None:
        with self._lock:
            self._subscribers.pop(token, None)

    # ---- request accounting ----------------------------------------------------------------------------

    def count_request(self, verb: str, resource: str) -> None:
        with self._lock:
            self._requests[(verb, resource)] += 1

    def request_counts(self, resource: str | None = None) -> dict[str, int]:
        """Requests served per Kubernetes verb (get, list, watch, create, update, patch, delete), optionally
        for one resource (`pods`, `pods/status`, `pods/binding`, `bindings`, `nodes`, `events`, ...)."""
        counts: collections.Counter[str] = collections.Counter()
        with self._lock:
            for (verb, res), n in self._requests.items():
                if resource is None or res == resource:
                    counts[verb] += n
        return dict(counts)

    def reset_request_counts(self) -> None:
        with self._lock:
            self._requests.clear()

    # ---- direct access for tests and the demo (no HTTP, no client-side API rules) ----------------------

    def create_pod(self, pod: Obj) -> Obj:
        """Create a pod as given (its `status` is kept; `phase` defaults to Pending). Returns a copy."""
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        return self._create_direct("pods", namespace, pod)

    def create_node(self, node: Obj) -> Obj:
        return self._create_direct("nodes", None, node)

    def update_pod(self, pod: Obj) -> Obj:
        """Replace a pod wholesale (spec and status included); uid and creationTimestamp are kept."""
        meta = pod.get("metadata") or {}
        return self._replace_direct("pods", meta.get("namespace") or "default", meta.get("name", ""), pod)

    def update_node(self, node: Obj) -> Obj:
        return self._replace_direct("nodes", None, (node.get("metadata") or {}).get("name", ""), node)

    def merge_patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        """JSON-merge-patch a pod, status and spec included, unconditionally. Returns a copy."""
        return self._merge_direct("pods", namespace, name, patch)

    def merge_patch_node(self, name: str, patch: Obj) -> Obj:
        return self._merge_direct("nodes", None, name, patch)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Obj:
        return self._merge_direct("pods", namespace, name, {"status": {"phase": phase}})

    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        return copy.deepcopy(self.bind(namespace, name, node))

    def delete_pod(self, namespace: str, name: str) -> Obj:
        return copy.deepcopy(self.delete("pods", namespace, name))

    def delete_node(self, name: str) -> Obj:
        return copy.deepcopy(self.delete("nodes", None, name))

    # resource.k8s.io/v1 and any other resource, by plural (`resourceslices`, `resourceclaims`, ...)
    def create_object(self, resource: str, body: Obj, namespace: str | None = None) -> Obj:
        """Create as given (a `status` in `body` is kept, as a controller would write it). Returns a copy."""
        kind = objects.resource_kinds()[resource]
        if kind.namespaced:
            namespace = namespace or (body.get("metadata") or {}).get("namespace") or "default"
        return self._create_direct(resource, namespace if kind.namespaced else None, body)

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        kind = objects.resource_kinds()[resource]
        return self._get_copy(resource, (namespace or "default") if kind.namespaced else None, name)

    def list_resource(self, resource: str, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            return copy.deepcopy([o for _, o in sorted(self._objects[resource].items())
                                  if namespace in (None, o["metadata"].get("namespace"))])

    def merge_patch_object(self, resource: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """JSON-merge-patch anything, status included, unconditionally. Returns a copy."""
        kind = objects.resource_kinds()[resource]
        return self._merge_direct(resource, (namespace or "default") if kind.namespaced else None, name, patch)

    def delete_object(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        kind = objects.resource_kinds()[resource]
        return copy.deepcopy(self.delete(resource, (namespace or "default") if kind.namespaced else None, name))

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        return self._get_copy("pods", namespace, name)

    def get_node(self, name: str) -> Obj | None:
        return self._get_copy("nodes", None, name)

    def list_pods(self, namespace: str | None = None, node_name: str | None = None) -> list[Obj]:
        with self._lock:
            pods = [p for _, p in sorted(self._objects["pods"].items())
                    if namespace in (None, p["metadata"].get("namespace"))
                    and node_name in (None, (p.get("spec") or {}).get("nodeName"))]
            return copy.deepcopy(pods)

    def list_nodes(self) -> list[Obj]:
        with self._lock:
            return copy.deepcopy([n for _, n in sorted(self._objects["nodes"].items())])

    def list_events(self, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            return copy.deepcopy([e for _, e in sorted(self._objects["events"].items())
                                  if namespace in (None, e["metadata"].get("namespace"))])

    # ---- internals -------------------------------------------------------------------------------------

    def _create_direct(self, resource: str, namespace: str | None, body: Obj) -> Obj:
        kind = objects.resource_kinds()[resource]
        obj = objects.prepare_create(kind, objects.decode_body(kind, body), namespace, uid=str(uuid.uuid4()),
                                     now=_now(), name_suffix=_suffix())
        status = copy.deepcopy(body.get("status") or {})
        if not kind.has_status:
            status = {}
        if resource == "pods":
            status.setdefault("phase", "Pending")
        if status:
            obj["status"] = status
        return copy.deepcopy(self._insert(resource, obj))

    def _replace_direct(self, resource: str, namespace: str | None, name: str, body: Obj) -> Obj:
        kind = objects.resource_kinds()[resource]
        objects.decode_body(kind, body)
        with self._lock:
            old = self.get(resource, namespace, name)
            new = copy.deepcopy(body)
            new["kind"], new["apiVersion"] = kind.kind, kind.api_version
            meta = new.setdefault("metadata", {})
            for key in ("name", "namespace", "uid", "creationTimestamp"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
            objects.validate(kind, new)
            return copy.deepcopy(self._commit(resource, _key(old), "MODIFIED", new, old))

    def _merge_direct(self, resource: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        with self._lock:
            old = self.get(resource, namespace, name)
            new = merge_patch(old, patch)
            meta = new.setdefault("metadata", {})
            for key in ("name", "namespace", "uid", "creationTimestamp"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
            objects.check_metadata_types(new)
            objects.validate(objects.resource_kinds()[resource], new)
            return copy.deepcopy(self._commit(resource, _key(old), "MODIFIED", new, old))

    def _get_copy(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects[resource].get((namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def _check_precondition(self, resource: str, old: Obj, new: Obj) -> None:
        wanted = (new.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise stale(resource, old["metadata"]["name"])

    def _commit(self, resource: str, key: tuple[str, str], event: str, obj: Obj, old: Obj | None) -> Obj:
        """Store (or remove, for DELETED) `obj` under a new resourceVersion and tell the watchers."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if event == "DELETED":
            del self._objects[resource][key]
        else:
            self._objects[resource][key] = obj
        record = WatchEvent(self._rv, event, obj, old, resource)
        self._history.append(record)
        if len(self._history) > self._history_size:
            self._compacted_rv = self._history.popleft().rv
        for token, (res, notify) in list(self._subscribers.items()):
            if res == resource and not _safe_notify(notify, record):
                del self._subscribers[token]
        return obj


def _safe_notify(notify: Notify, event: WatchEvent | None) -> bool:
    try:
        notify(event)
    except RuntimeError:  # the watcher's event loop is closed
        return False
    return True


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _suffix() -> str:
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))



@dataclass(frozen=True)
class WatchEvent:
    """One change: `obj` is the object after it (the last state for DELETED), `old` the one before."""

    rv: int
    type: str  # ADDED, MODIFIED or DELETED
    obj: Obj
    old: Obj | None
    resource: str = ""
