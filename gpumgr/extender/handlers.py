"""HTTP routes of the extender: `<prefix>/filter`, `<prefix>/prioritize`, `<prefix>/bind`, `/healthz`, `/readyz`.

Every error is JSON (`{"Error": "..."}`): 400 for a body the extender cannot use, 413 for one over the size
limit (also when it only expands past it), 408 for a body that does not arrive in time, 415 for an unknown
Content-Encoding, 503 when too many bodies are in flight or when this replica is not the elected leader
(`gate`, see `leader.Elector.refusal`), 404/405 for wrong paths and methods;
a bind the extender must never make (see `binder.BindRefused`) 403/409/422. A bind that fails for any other reason is
HTTP 200 with `Error`, as the API wants. Bodies are read by `body.read_body`, never `request.read()`.

`/readyz` is 200 once the view is synced and, with leader election, the election loop runs (`health`): a
standby is ready too, so rolling updates and disruption budgets work; the Service routes to the leader by its
pod label (`leaderlabel`). `/healthz` is 500 when the election loop has ended: the kubelet restarts the container.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from itertools import compress
from operator import attrgetter, not_
from typing import Any

from aiohttp import web

from gpumgr.extender.ask import AskError, PodAsk, pod_ask, pod_uid
from gpumgr.extender.binder import Binder, BindRefused
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.lane import SmallestFirst
from gpumgr.extender.score import scores
from gpumgr.extender.wire import (
    BadRequest,
    ExtenderArgs,
    binding_reply,
    decode_json,
    filter_reply,
    parse_binding_args,
    parse_extender_args,
    priority_reply,
)
from gpumgr.requests.mig_ask import mig_asks
from gpumgr.serving.body import BodyBudget, BodyError, ClientGone, Limits, read_body

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Gate = Callable[[], str]  # why this replica must not serve now, or "" (leader election)
Health = Callable[[], str]  # why the election loop is not running, or ""


def build_app(view: ClusterView, binder: Binder, policy: str, prefix: str, limits: Limits,
              gate: Gate | None = None, health: Health | None = None) -> web.Application:
    routes = Routes(view, binder, policy, limits, gate, health)
    app = web.Application(middlewares=[json_errors(), send_within(limits.body_timeout)],
                          client_max_size=limits.max_body_bytes)
    app.router.add_post(f"{prefix}/filter", routes.filter)
    app.router.add_post(f"{prefix}/prioritize", routes.prioritize)
    app.router.add_post(f"{prefix}/bind", routes.bind)
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/readyz", routes.readyz)
    return app


def build_probe_app(view: ClusterView, gate: Gate | None = None, health: Health | None = None) -> web.Application:
    """Only `/healthz` and `/readyz`, for kubelet probes on a plain-HTTP port (they present no client cert)."""
    routes = Routes(view, None, "", Limits(), gate, health)
    app = web.Application(middlewares=[json_errors()], client_max_size=1024)
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/readyz", routes.readyz)
    return app


MAX_UNKNOWN_NAMES = 1000  # node names per call the extender does not know (new nodes its watch has not shown yet)
SYNCING = "the gpumgr extender is still listing nodes and pods; try again shortly"


class Routes:
    def __init__(self, view: ClusterView, binder: Binder | None, policy: str, limits: Limits,
                 gate: Gate | None = None, health: Health | None = None):
        self.gate = gate
        self.health = health
        self.view = view
        self.binder = binder
        self.policy = policy
        self.limits = limits
        self.budget = BodyBudget(limits.budget_bytes)
        self.lane = SmallestFirst()
        self.max_json_elements = limits.max_json_elements

    def _check_known(self, names: list[str]) -> None:
        """A scheduler names the nodes of its cluster: a call naming many the extender has never seen is refused
        (cheaply, before any verdict or a large answer is made)."""
        nodes = self.view.nodes
        unknown = len(names) - sum(map(nodes.__contains__, names))
        if unknown > MAX_UNKNOWN_NAMES:
            raise BadRequest(f"{unknown} of the {len(names)} node names are not nodes of this cluster (at most "
                             f"{MAX_UNKNOWN_NAMES} may be unknown; the gpumgr extender knows {len(nodes)} nodes)")

    def _decode(self, raw: bytes) -> Any:
        return decode_json(raw, self.max_json_elements)

    def _not_leading(self) -> web.Response | None:
        why = self.gate() if self.gate is not None else ""
        return not_leader_reply(why) if why else None

    async def filter(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request, self.limits, self.budget)
        if refused := self._not_leading():
            return refused
        async with self.lane.turn(len(raw)):  # decoding, the verdicts and the answer run without awaiting
            return self._filter(self._decode(raw))

    def _filter(self, doc: Any) -> web.Response:
        args = parse_extender_args(doc)
        ask = _ask(args.pod)
        mig = _mig_asks(args.pod)
        names = args.node_names
        if not ask.wants_gpu and not mig:
            return reply(filter_reply(args, list(names), {}, {}))
        if not self.view.ready:  # until the first lists are in, every node would look empty
            return reply(filter_reply(args, [], dict.fromkeys(names, SYNCING), {}))
        self._check_known(names)
        if mig:
            return reply(self._filter_mig(args, ask, mig))
        fits = self.view.verdicts(ask, pod_uid(args.pod), names)
        oks = list(map(attrgetter("ok"), fits))
        passed = list(compress(names, oks))
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        if len(passed) < len(names):  # the nodes that failed, in order (picked out at C speed)
            for name, fit in compress(zip(names, fits, strict=True), map(not_, oks)):
                if fit.unresolvable:
                    never[name] = fit.reason
                else:
                    failed[name] = fit.reason
        log.debug("filter pod %s: %d of %d nodes fit", _pod_name(args.pod), len(passed), len(names))
        return reply(filter_reply(args, passed, failed, never))

    def _filter_mig(self, args: ExtenderArgs, ask: PodAsk, mig: dict[str, int]) -> Any:
        """A pod asking MIG instances of the device plugins (and perhaps vcuda too): a node passes when both fit."""
        names = args.node_names
        uid = pod_uid(args.pod)
        reasons = self.view.mig_reasons(mig, uid, list(names))
        if ask.wants_gpu:
            for k, fit in enumerate(self.view.verdicts(ask, uid, names)):
                if not fit.ok:
                    reasons[k] = "; ".join(r for r in (fit.reason, reasons[k]) if r)
        passed = [n for n, r in zip(names, reasons, strict=True) if not r]
        failed = {n: r for n, r in zip(names, reasons, strict=True) if r}
        log.debug("filter pod %s (MIG): %d of %d nodes fit", _pod_name(args.pod), len(passed), len(names))
        return filter_reply(args, passed, failed, {})

    async def prioritize(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request, self.limits, self.budget)
        if refused := self._not_leading():
            return refused
        async with self.lane.turn(len(raw)):
            return self._prioritize(self._decode(raw))

    def _prioritize(self, doc: Any) -> web.Response:
        args = parse_extender_args(doc)
        ask = _ask(args.pod)
        names = args.node_names
        if not ask.wants_gpu:
            return reply_bytes(priority_reply(names, [0] * len(names)))
        if self.view.ready:
            self._check_known(names)
        fits = self.view.placements(ask, pod_uid(args.pod), names)
        return reply_bytes(priority_reply(names, scores(fits, self.policy)))

    async def bind(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request, self.limits, self.budget)
        async with self.lane.turn(len(raw)):
            args = parse_binding_args(self._decode(raw))
        assert self.binder is not None
        why = self.gate() if self.gate is not None else ""
        if why:
            log.info("bind of pod %s/%s to node %s refused (503): %s", args.namespace, args.name, args.node, why)
            return not_leader_reply(why)
        if not self.view.ready:
            return reply(binding_reply(SYNCING))
        try:
            return reply(binding_reply(await self.binder.bind(args)))
        except BindRefused as e:
            log.warning("bind of pod %s/%s to node %s refused (%d): %s", args.namespace, args.name, args.node,
                        e.status, e)
            resp = reply(binding_reply(f"gpumgr: refusing to bind pod {args.namespace}/{args.name} to node "
                                       f"{args.node}: {e}"), status=e.status)
            if e.status == 503:  # stopped leading mid-bind: see not_leader_reply
                resp.force_close()
            return resp

    async def healthz(self, _request: web.Request) -> web.StreamResponse:
        broken = self.health() if self.health is not None else ""
        if broken:
            return reply({"status": "election-stopped", "reason": broken}, status=500)
        return reply({"status": "alive"})

    async def readyz(self, _request: web.Request) -> web.StreamResponse:
        broken = self.health() if self.health is not None else ""
        if broken:
            return reply({"status": "election-stopped", "reason": broken}, status=503)
        if self.view.ready:
            doc: dict[str, Any] = {"status": "ready", "nodes": len(self.view.nodes)}
            if self.gate is not None:
                why = self.gate()
                doc["leader"] = not why
                if why:
                    doc["reason"] = why
            return reply(doc)
        missing = sorted({"nodes", "pods"} - self.view.synced)
        return reply({"status": "syncing", "waiting_for": missing}, status=503)


def reply(body: Any, status: int = 200) -> web.Response:
    return reply_bytes(json.dumps(body, separators=(",", ":")).encode(), status)


def not_leader_reply(why: str) -> web.Response:
    """503 from a replica that is not the serving leader. The connection is closed: a Service balances
    connections, not requests, so the caller's next connection goes to a ready replica (the leader) instead of
    staying pinned to this one."""
    resp = reply({"Error": why}, status=503)
    resp.force_close()
    return resp


def reply_bytes(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def send_within(timeout: float) -> Any:
    """The answer must be taken by the caller within `timeout` seconds, or the connection is dropped: a caller
    that does not read cannot keep answers in the process's memory."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        if resp.prepared:
            return resp
        try:
            async with asyncio.timeout(timeout):
                await resp.prepare(request)
                await resp.write_eof()
        except (TimeoutError, ConnectionError) as e:
            log.info("%s %s from %s: the answer was not taken within %g s (%s); connection dropped",
                     request.method, request.path, request.remote, timeout, type(e).__name__)
            if request.transport is not None:
                request.transport.abort()
        return resp

    return middleware


def json_errors() -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as e:
            log.info("%s %s: 400: %s", request.method, request.path, e)
            return reply({"Error": str(e)}, status=400)
        except BodyError as e:
            log.info("%s %s from %s: %d: %s", request.method, request.path, request.remote, e.status, e)
            resp = reply({"Error": str(e)}, status=e.status)
            if e.close:
                resp.force_close()  # the rest of the body is not read: the connection cannot carry another request
            return resp
        except ClientGone as e:
            log.info("%s %s from %s: %s", request.method, request.path, request.remote, e)
            resp = reply({"Error": str(e)}, status=400)
            resp.force_close()
            return resp
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return reply({"Error": e.reason}, status=e.status)
        except Exception as e:  # noqa: BLE001 - a bug must not become a traceback to the scheduler
            log.exception("%s %s failed", request.method, request.path)
            return reply({"Error": f"internal error in the gpumgr extender: {type(e).__name__}: {e}"}, status=500)

    return middleware


def _ask(pod: dict[str, Any]) -> PodAsk:
    try:
        return pod_ask(pod)
    except AskError as e:
        raise BadRequest(f"Pod: {e}") from None


def _mig_asks(pod: dict[str, Any]) -> dict[str, int]:
    try:
        return mig_asks(pod)
    except ValueError as e:
        raise BadRequest(f"Pod: {e}") from None


def _pod_name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
