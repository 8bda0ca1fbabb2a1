"""HTTP routes of the extender: `<prefix>/filter`, `<prefix>/prioritize`, `<prefix>/bind`, `/healthz`, `/readyz`.

Every error is JSON (`{"Error": "..."}`): 400 for a body the extender cannot use, 413 for one over the size
limit, 404/405 for wrong paths and methods. A bind that fails is HTTP 200 with `Error`, as the API wants.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gpumgr.extender.ask import AskError, PodAsk, pod_ask, pod_uid
from gpumgr.extender.binder import Binder
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.score import scores
from gpumgr.extender.wire import (
    BadRequest,
    binding_reply,
    decode_json,
    filter_reply,
    parse_binding_args,
    parse_extender_args,
    priority_reply,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(view: ClusterView, binder: Binder, policy: str, prefix: str, max_body_bytes: int) -> web.Application:
    routes = Routes(view, binder, policy)
    app = web.Application(middlewares=[json_errors(max_body_bytes)], client_max_size=max_body_bytes)
    app.router.add_post(f"{prefix}/filter", routes.filter)
    app.router.add_post(f"{prefix}/prioritize", routes.prioritize)
    app.router.add_post(f"{prefix}/bind", routes.bind)
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/readyz", routes.readyz)
    return app


SYNCING = "the gpumgr extender is still listing nodes and pods; try again shortly"


class Routes:
    def __init__(self, view: ClusterView, binder: Binder, policy: str):
        self.view = view
        self.binder = binder
        self.policy = policy

    async def filter(self, request: web.Request) -> web.StreamResponse:
        args = parse_extender_args(decode_json(await request.read()))
        ask = _ask(args.pod)
        names = args.node_names
        if not ask.wants_gpu:
            return reply(filter_reply(args, list(names), {}, {}))
        if not self.view.ready:  # until the first lists are in, every node would look empty
            return reply(filter_reply(args, [], dict.fromkeys(names, SYNCING), {}))
        passed: list[str] = []
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        for name, fit in zip(names, self.view.verdicts(ask, pod_uid(args.pod), names), strict=True):
            if fit.ok:
                passed.append(name)
            elif fit.unresolvable:
                never[name] = fit.reason
            else:
                failed[name] = fit.reason
        log.debug("filter pod %s: %d of %d nodes fit", _pod_name(args.pod), len(passed), len(names))
        return reply(filter_reply(args, passed, failed, never))

    async def prioritize(self, request: web.Request) -> web.StreamResponse:
        args = parse_extender_args(decode_json(await request.read()))
        ask = _ask(args.pod)
        names = args.node_names
        if not ask.wants_gpu:
            return reply_bytes(priority_reply(names, [0] * len(names)))
        fits = self.view.placements(ask, pod_uid(args.pod), names)
        return reply_bytes(priority_reply(names, scores(fits, self.policy)))

    async def bind(self, request: web.Request) -> web.StreamResponse:
        args = parse_binding_args(decode_json(await request.read()))
        if not self.view.ready:
            return reply(binding_reply(SYNCING))
        return reply(binding_reply(await self.binder.bind(args)))

    async def healthz(self, _request: web.Request) -> web.StreamResponse:
        return reply({"status": "alive"})

    async def readyz(self, _request: web.Request) -> web.StreamResponse:
        if self.view.ready:
            return reply({"status": "ready", "nodes": len(self.view.nodes)})
        missing = sorted({"nodes", "pods"} - self.view.synced)
        return reply({"status": "syncing", "waiting_for": missing}, status=503)


def reply(body: Any, status: int = 200) -> web.Response:
    return reply_bytes(json.dumps(body, separators=(",", ":")).encode(), status)


def reply_bytes(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def json_errors(max_body_bytes: int) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as e:
            log.info("%s %s: 400: %s", request.method, request.path, e)
            return reply({"Error": str(e)}, status=400)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            text = e.reason
            if e.status == 413:
                text = f"the body is larger than the limit of {max_body_bytes} bytes"
            return reply({"Error": text}, status=e.status)
        except Exception as e:  # noqa: BLE001 - a bug must not become a traceback to the scheduler
            log.exception("%s %s failed", request.method, request.path)
            return reply({"Error": f"internal error in the gpumgr extender: {type(e).__name__}: {e}"}, status=500)

    return middleware


def _ask(pod: dict[str, Any]) -> PodAsk:
    try:
        return pod_ask(pod)
    except AskError as e:
        raise BadRequest(f"Pod: {e}") from None


def _pod_name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
