"""HTTP routes of the test API server: the core/v1 REST paths for pods, nodes, events and bindings, and the
`resource.k8s.io/v1` paths for ResourceSlices, ResourceClaims (with status), ResourceClaimTemplates, DeviceClasses,
and the `coordination.k8s.io/v1` path for Leases.

Every failure is a JSON `v1.Status` with the HTTP code and reason the real server would use.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web

from gpumgr.sim.kubeapi import discovery, objects
from gpumgr.sim.kubeapi.errors import ApiError, bad_request, invalid, success_status
from gpumgr.sim.kubeapi.listing import list_body
from gpumgr.sim.kubeapi.objects import GROUPS, ResourceKind
from gpumgr.sim.kubeapi.patch import PatchError, PatchFailed, json_patch, merge_patch, strategic_merge_patch
from gpumgr.sim.kubeapi.selectors import ObjectFilter, parse_field_selector, parse_label_selector
from gpumgr.sim.kubeapi.store import KubeStore, WatchEvent
from gpumgr.sim.kubeapi.watch import WatchSettings, stream_watch

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PATCHERS: Mapping[str, Callable[[Any, Any], Any]] = MappingProxyType({
    "application/merge-patch+json": merge_patch,
    "application/strategic-merge-patch+json": strategic_merge_patch,
    "application/json-patch+json": json_patch,
})
_REASONS = MappingProxyType({
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    406: "NotAcceptable", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
})
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"", "0", "f", "F", "false", "FALSE", "False"})


def build_app(store: KubeStore, *, bookmark_interval: float = 5.0,
              max_body_bytes: int = 3 * 1024 * 1024) -> web.Application:
    """The aiohttp application serving `store`. Watches end when the application shuts down."""
    routes = _Routes(store, bookmark_interval)
    app = web.Application(middlewares=[_errors], client_max_size=max_body_bytes)
    app.on_shutdown.append(routes.end_watches)
    add = app.router.add_route
    for slash in ("", "/"):  # the generated client asks for `/version/`, `/api/`, `/api/v1/`
        add("GET", "/version" + slash, routes.static(discovery.version))
        add("GET", "/apis" + slash, routes.static(discovery.api_groups))
        add("GET", "/api/v1" + slash, routes.static(discovery.core_resources))
        for name in GROUPS:
            add("GET", f"/apis/{name}" + slash, routes.static(functools.partial(discovery.api_group, name)))
            add("GET", f"/apis/{name}/v1" + slash, routes.static(functools.partial(discovery.group_resources, name)))
        add("GET", "/api" + slash, routes.api_versions)
    for probe in ("/healthz", "/readyz", "/livez"):
        add("GET", probe, routes.health)
    add("*", "/api/v1/namespaces/{namespace}/bindings", routes.bindings)
    add("*", "/api/v1/namespaces/{namespace}/{resource}", routes.collection)
    add("*", "/api/v1/namespaces/{namespace}/{resource}/{name}", routes.item)
    add("*", "/api/v1/namespaces/{namespace}/{resource}/{name}/{sub}", routes.subresource)
    add("*", "/api/v1/{resource}", routes.collection)
    add("*", "/api/v1/{resource}/{name}", routes.item)
    add("*", "/api/v1/{resource}/{name}/{sub}", routes.subresource)
    for name in GROUPS:
        group = f"/apis/{name}/v1"
        add("*", group + "/namespaces/{namespace}/{resource}", routes.collection)
        add("*", group + "/namespaces/{namespace}/{resource}/{name}", routes.item)
        add("*", group + "/namespaces/{namespace}/{resource}/{name}/{sub}", routes.subresource)
        add("*", group + "/{resource}", routes.collection)
        add("*", group + "/{resource}/{name}", routes.item)
        add("*", group + "/{resource}/{name}/{sub}", routes.subresource)
    add("*", "/{tail:.*}", routes.unknown)
    return app


class _Routes:
    def __init__(self, store: KubeStore, bookmark_interval: float) -> None:
        self.store = store
        self.bookmark_interval = bookmark_interval
        self.watches: set[asyncio.Queue[WatchEvent | None]] = set()

    async def end_watches(self, _app: web.Application) -> None:
        for queue in list(self.watches):
            queue.put_nowait(None)

    def static(self, body: Callable[[], dict[str, Any]]) -> Handler:
        async def handler(_request: web.Request) -> web.StreamResponse:
            return _json(body())

        return handler

    async def _lag(self, kind: ResourceKind) -> None:
        delay = self.store.latency.get(kind.plural, 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        gate = self.store.gates.get(kind.plural)
        if gate is not None:
            await gate.wait()

    async def api_versions(self, request: web.Request) -> web.StreamResponse:
        return _json(discovery.api_versions(request.host))

    async def health(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def unknown(self, request: web.Request) -> web.StreamResponse:
        raise _no_such_path()

    # ---- collections: list, watch, create ---------------------------------------------------------------

    async def collection(self, request: web.Request) -> web.StreamResponse:
        kind, namespace = _resolve(request, item=False)
        await self._lag(kind)
        if request.method in ("GET", "DELETE"):
            flt = ObjectFilter(namespace, parse_label_selector(request.query.get("labelSelector")),
                               parse_field_selector(request.query.get("fieldSelector"), kind.fields))
            if request.method == "DELETE" and (namespace is not None or not kind.namespaced):
                self.store.count_request("deletecollection", kind.plural)
                _refuse_dry_run(request)
                self.store.delete_collection(kind.plural, flt)
                return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
            if request.method == "DELETE":
                raise _not_allowed()
            if _flag(request, "watch"):
                self.store.count_request("watch", kind.plural)
                return await stream_watch(request, self.store, kind, flt, self._watch_settings(request))
            self.store.count_request("list", kind.plural)
            items, rv = self.store.list_objects(kind.plural, flt)
            return _json(list_body(kind, items, rv, _int(request, "limit") or 0,
                                   request.query.get("continue")))
        if request.method == "POST" and (namespace is not None or not kind.namespaced):
            self.store.count_request("create", kind.plural)
            _refuse_dry_run(request)
            created = self.store.create(kind.plural, namespace, await _json_body(request))
            return _json(created, status=201)
        raise _not_allowed()

    def _watch_settings(self, request: web.Request) -> WatchSettings:
        rv = request.query.get("resourceVersion", "")
        since: int | None = None
        if rv not in ("", "0"):
            if not rv.isdigit():
                raise bad_request(f"invalid resource version {rv!r}: must be a non-negative integer")
            since = int(rv)
        timeout = _int(request, "timeoutSeconds")
        return WatchSettings(since=since, timeout=float(timeout) if timeout else None,
                             bookmarks=_flag(request, "allowWatchBookmarks"),
                             bookmark_interval=self.bookmark_interval, active=self.watches)

    # ---- single objects: get, update, patch, delete --------------------------------------------------

    async def item(self, request: web.Request) -> web.StreamResponse:
        kind, namespace = _resolve(request, item=True)
        await self._lag(kind)
        name = request.match_info["name"]
        if request.method == "GET":
            self.store.count_request("get", kind.plural)
            return _json(self.store.get(kind.plural, namespace, name))
        if request.method == "PUT":
            self.store.count_request("update", kind.plural)
            _refuse_dry_run(request)
            return _json(self.store.replace(kind.plural, namespace, name, await _json_body(request)))
        if request.method == "PATCH":
            self.store.count_request("patch", kind.plural)
            _refuse_dry_run(request)
            apply = await _patch_function(request, kind, name)
            return _json(self.store.patch(kind.plural, namespace, name, apply))
        if request.method == "DELETE":
            self.store.count_request("delete", kind.plural)
            _refuse_dry_run(request)
            uid, rv = await _delete_preconditions(request)
            deleted = self.store.delete(kind.plural, namespace, name, uid=uid, resource_version=rv)
            if kind.returns_deleted_object:
                return _json(deleted)
            return _json(success_status(kind.plural, name, deleted["metadata"]["uid"]))
        raise _not_allowed()

    # ---- subresources: status, binding -------------------------------------------------------------------

    async def subresource(self, request: web.Request) -> web.StreamResponse:
        kind, namespace = _resolve(request, item=True)
        await self._lag(kind)
        name, sub = request.match_info["name"], request.match_info["sub"]
        if sub == "binding" and kind.plural == "pods":
            if request.method != "POST":
                raise _not_allowed()
            self.store.count_request("create", "pods/binding")
            assert namespace is not None
            return await self._bind(request, namespace, name)
        if sub != "status" or not kind.has_status:
            raise _no_such_path()
        label = f"{kind.plural}/status"
        if request.method == "GET":
            self.store.count_request("get", label)
            return _json(self.store.get(kind.plural, namespace, name))
        if request.method == "PUT":
            self.store.count_request("update", label)
            _refuse_dry_run(request)
            body = await _json_body(request)
            return _json(self.store.replace(kind.plural, namespace, name, body, status_only=True))
        if request.method == "PATCH":
            self.store.count_request("patch", label)
            _refuse_dry_run(request)
            apply = await _patch_function(request, kind, name)
            return _json(self.store.patch(kind.plural, namespace, name, apply, status_only=True))
        raise _not_allowed()

    async def bindings(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        objects.check_namespace(namespace)
        if request.method != "POST":
            raise _not_allowed()
        self.store.count_request("create", "bindings")
        return await self._bind(request, namespace, None)

    async def _bind(self, request: web.Request, namespace: str, url_name: str | None) -> web.StreamResponse:
        _refuse_dry_run(request)
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise bad_request("the body of a Binding request must be a JSON object")
        if body.get("kind") not in (None, "", "Binding"):
            raise bad_request(f"the kind in the body ({body.get('kind')}) does not match the expected kind "
                              "Binding")
        objects.check_metadata_types(body)
        meta = body.get("metadata") or {}
        name = meta.get("name") or url_name
        if url_name is not None and meta.get("name") not in (None, "", url_name):
            raise bad_request(f"name in the URL ({url_name}) does not match the name in the Binding "
                              f"({meta.get('name')})")
        if not name:
            raise invalid("bindings", "", "metadata.name: Required value")
        if meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        target = body.get("target")
        if not isinstance(target, dict) or not isinstance(target.get("name"), str) or not target["name"]:
            raise invalid("bindings", name, "target.name: Required value")
        if target.get("kind") not in (None, "", "Node"):
            raise invalid("bindings", name, f"target.kind: Invalid value: {target.get('kind')!r}: must be "
                          "empty or 'Node'")
        annotations = meta.get("annotations") or {}
        self.store.bind(namespace, name, target["name"], uid=meta.get("uid") or None, annotations=annotations,
                        resource_version=str(meta.get("resourceVersion") or "") or None)
        out_meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if annotations:
            out_meta["annotations"] = annotations
        return _json({"kind": "Binding", "apiVersion": "v1", "metadata": out_meta,
                      "target": {"kind": "Node", "apiVersion": "v1", "name": target["name"]}}, status=201)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _json(exc.status(), status=exc.code)
    except web.HTTPException as exc:  # raised by aiohttp itself, e.g. a body over the size limit
        if exc.status < 400:
            raise
        err = ApiError(exc.status, _REASONS.get(exc.status, "Unknown"), exc.reason)
        return _json(err.status(), status=exc.status)
    except Exception as exc:
        log.exception("kubeapi: %s %s failed", request.method, request.path)
        err = ApiError(500, "InternalError", f"internal error in the test API server: {exc!r}")
        return _json(err.status(), status=500)


def _resolve(request: web.Request, *, item: bool) -> tuple[ResourceKind, str | None]:
    namespace = request.match_info.get("namespace")
    kind = objects.resource_kinds().get(request.match_info["resource"])
    group = next((g for g in GROUPS if request.path.startswith(f"/apis/{g}/")), "")
    if kind is None or kind.group != group or (namespace is not None and not kind.namespaced):
        raise _no_such_path()
    if item and kind.namespaced and namespace is None:
        raise _no_such_path()
    if namespace is not None:
        objects.check_namespace(namespace)
    return kind, namespace


async def _json_body(request: web.Request) -> Any:
    ctype = request.content_type
    if request.headers.get("Content-Type") and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                       f"accepted media types include: application/json (got {ctype})")
    raw = await request.read()
    if not raw.strip():
        raise bad_request("the request has no body; a JSON object is required")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"error decoding request body as JSON: {exc}") from None


async def _patch_function(request: web.Request, kind: ResourceKind, name: str) -> Callable[[Any], Any]:
    patcher = _PATCHERS.get(request.content_type)
    if patcher is None:
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                       f"accepted media types include: {', '.join(_PATCHERS)} (got {request.content_type})")
    raw = await request.read()
    try:
        patch = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"error decoding patch body as JSON: {exc}") from None
    if patcher is not json_patch and not isinstance(patch, dict):
        raise bad_request(f"a {request.content_type} body must be a JSON object, got {type(patch).__name__}")

    def apply(current: Any) -> Any:
        try:
            return patcher(current, patch)
        except PatchError as exc:
            raise bad_request(str(exc)) from None
        except PatchFailed as exc:
            raise invalid(kind.plural, name, str(exc)) from None

    return apply


async def _delete_preconditions(request: web.Request) -> tuple[str | None, str | None]:
    raw = await request.read()
    if not raw.strip():
        return None, None
    try:
        options = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"error decoding DeleteOptions as JSON: {exc}") from None
    if not isinstance(options, dict):
        raise bad_request("DeleteOptions must be a JSON object")
    pre = options.get("preconditions") or {}
    if not isinstance(pre, dict):
        raise bad_request("DeleteOptions.preconditions must be a JSON object")
    uid, rv = pre.get("uid"), pre.get("resourceVersion")
    for key, value in (("uid", uid), ("resourceVersion", rv)):
        if value is not None and not isinstance(value, str):
            raise bad_request(f"DeleteOptions.preconditions.{key} must be a string")
    return uid, rv


def _refuse_dry_run(request: web.Request) -> None:
    if "dryRun" in request.query:
        raise bad_request("dryRun is not supported by the gpumgr test API server")


def _flag(request: web.Request, key: str) -> bool:
    value = request.query.get(key, "")
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f"invalid value for {key}: {value!r} (expected true or false)")


def _int(request: web.Request, key: str) -> int | None:
    value = request.query.get(key)
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise bad_request(f"invalid value for {key}: {value!r} (expected a non-negative integer)")
    return int(value)


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


def _no_such_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def _not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed",
                    "the server does not allow this method on the requested resource")
