"""Bind: choose the pod's cards on the node, assume them, record them on the pod, then create the Binding.

Choosing and assuming happen in one step without an await, under the node's lock, so two binds to one node
can never take the same card; the API calls happen outside the lock. The pod's annotations are patched with
its resourceVersion (a merge patch): on 409 the pod is read again and the patch retried, a bounded number of
times. Any failure gives back what was assumed and removes the annotations written, and is answered as the
extender API wants it: HTTP 200 with `Error`.

Binds the extender must never make are refused before anything is assumed or written (`BindRefused`, a 4xx):
a pod that asks for no vcuda resource or names another scheduler (403), a pod already bound (409), a node
that does not exist or has no usable GPU inventory (422).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gpumgr import podspec
from gpumgr.allocator import Allocation
from gpumgr.extender.ask import AskError, PodAsk, pod_ask, pod_uid
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.kubeaccess import ApiCallError
from gpumgr.extender.wire import BindingArgs

if TYPE_CHECKING:
    from gpumgr.extender.podcalls import PodCalls

log = logging.getLogger(__name__)

PATCH_ATTEMPTS = 5
DEFAULT_SCHEDULER = "gpumgr-scheduler"


class BindError(Exception):
    pass


class BindRefused(Exception):
    """A bind this extender never makes; answered with `status` (4xx) and a JSON `Error`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Binder:
    def __init__(self, view: ClusterView, access: PodCalls, attempts: int = PATCH_ATTEMPTS,
                 scheduler_name: str = DEFAULT_SCHEDULER):
        self.view = view
        self.access = access
        self.attempts = attempts
        self.scheduler_name = scheduler_name
        self._locks: dict[str, asyncio.Lock] = {}

    async def bind(self, args: BindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error for the scheduler. Raises BindRefused."""
        where = f"pod {args.namespace}/{args.name} to node {args.node}"
        try:
            await self._bind(args)
        except BindError as e:
            log.warning("bind %s failed: %s", where, e)
            return f"gpumgr: cannot bind {where}: {e}"
        return ""

    async def _bind(self, args: BindingArgs) -> None:
        pod = await self._pod(args)
        try:
            ask = pod_ask(pod)
        except AskError as e:
            raise BindError(str(e)) from None
        if not ask.wants_gpu:
            await self._create_binding(args)
            log.info("bound pod %s/%s to node %s (no GPU)", args.namespace, args.name, args.node)
            return
        uid = pod_uid(pod)
        lock = self._locks.setdefault(args.node, asyncio.Lock())
        async with lock:
            ptime, cards, annotations = self._assume(uid, ask, args.node)
        done = False
        try:
            written = await self._patch(args, pod, annotations)
            try:
                await self._create_binding(args)
            except BindError:
                await self._unpatch(args, written, ptime, list(annotations))
                raise
            done = True
        finally:
            if not done:  # failed, or cancelled: give back what was assumed
                self.view.forget(uid, ptime)
        log.info("bound pod %s/%s to node %s: %s", args.namespace, args.name, args.node,
                 ", ".join(f"container {n}: cards {c}" for n, c in cards))

    async def _pod(self, args: BindingArgs) -> dict[str, Any]:
        pod = self.view.pod(args.namespace, args.name)
        if pod is None or (args.uid and pod_uid(pod) != args.uid):
            pod = await self._read(args)
        if args.uid and pod_uid(pod) != args.uid:
            raise BindError(f"the pod has UID {pod_uid(pod)}, the scheduler asked for {args.uid}")
        self._refuse(pod, args.node)
        return pod

    def _refuse(self, pod: dict[str, Any], node_name: str) -> None:
        """Raise BindRefused for a bind this extender must never make."""
        spec = pod.get("spec") or {}
        bound = spec.get("nodeName")
        if bound:
            raise BindRefused(409, f"the pod is already bound to node {bound}")
        name = spec.get("schedulerName") or "default-scheduler"
        if name != self.scheduler_name:
            raise BindRefused(403, f"the pod's spec.schedulerName is {name!r}; this extender binds only pods of "
                              f"{self.scheduler_name!r} (--scheduler-name)")
        try:
            gpu = podspec.is_gpu_pod(pod)
        except (ValueError, AttributeError):
            gpu = True  # asks something unreadable for vcuda: pod_ask reports it
        if not gpu:
            raise BindRefused(403, f"the pod asks for no {podspec.RESOURCE_CORE} or {podspec.RESOURCE_MEMORY}; "
                              "this extender binds only pods that do")
        node = self.view.nodes.get(node_name)
        if node is None:
            raise BindRefused(422, f"node {node_name} does not exist (it is not in the cluster's node list)")
        if node.shape is None:
            raise BindRefused(422, f"node {node_name} is not a GPU node: {node.problem}")

    async def _read(self, args: BindingArgs) -> dict[str, Any]:
        try:
            return await self.access.get_pod(args.namespace, args.name)
        except ApiCallError as e:
            raise BindError(f"cannot read the pod: {e}") from None

    def _assume(self, uid: str, ask: PodAsk, node: str) -> tuple[str, list[tuple[str, list[int]]], dict[str, str]]:
        """Choose and assume, without awaiting: atomic on the event loop."""
        pending = self.view.assumed(uid)
        if pending is not None:
            raise BindError(f"a bind of this pod to node {pending.node} is in progress")
        fit = self.view.placement(ask, uid, node)
        if not fit.ok:
            raise BindError(fit.reason)
        state = self.view.nodes[node]
        shape = state.shape
        assert shape is not None
        ptime = str(time.time_ns())
        allocs, cards, annotations = [], [], {}
        for need, chosen in zip(ask.containers, fit.cards, strict=True):
            allocs.append(Allocation(key=f"{uid}/{need.index}", cards=chosen, cores=need.cores,
                                     memory_mib=need.memory_units * shape.unit_mib))
            minors = shape.minors(chosen)
            cards.append((need.name, minors))
            annotations[f"{podspec.ANN_PREDICATE_IDX}{need.index}"] = ",".join(str(m) for m in minors)
        annotations[podspec.ANN_PREDICATE_NODE] = node
        annotations[podspec.ANN_PREDICATE_TIME] = ptime
        annotations[podspec.ANN_ASSIGNED] = "false"
        self.view.assume(uid, node, allocs, ptime)
        return ptime, cards, annotations

    async def _patch(self, args: BindingArgs, pod: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
        """Write the annotations with optimistic concurrency; returns the patched pod."""
        for attempt in range(1, self.attempts + 1):
            meta = pod.get("metadata") or {}
            values: dict[str, str | None] = {
                k: None for k in podspec.pod_annotations(pod)
                if k.startswith(podspec.ANN_PREDICATE_IDX) and k not in annotations
            }
            values.update(annotations)
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": values}}
            try:
                return await self.access.patch_pod(args.namespace, args.name, patch)
            except ApiCallError as e:
                if e.status != 409 or attempt == self.attempts:
                    raise BindError(f"cannot record the cards on the pod: {e}") from None
            log.info("pod %s/%s changed while binding (attempt %d); reading it again", args.namespace,
                     args.name, attempt)
            pod = await self._read(args)
            if args.uid and pod_uid(pod) != args.uid:
                raise BindError("the pod was replaced while binding")
            if (pod.get("spec") or {}).get("nodeName"):
                raise BindError(f"the pod was bound to node {pod['spec']['nodeName']} meanwhile")
        raise BindError("unreachable")  # pragma: no cover

    async def _create_binding(self, args: BindingArgs) -> None:
        try:
            await self.access.bind_pod(args.namespace, args.name, args.uid, args.node)
        except ApiCallError as e:
            if e.status in (0, 500, 503, 504):  # no clear answer: the Binding may have been made after all
                try:
                    pod = await self.access.get_pod(args.namespace, args.name)
                except ApiCallError:
                    pod = {}
                if (pod.get("spec") or {}).get("nodeName") == args.node and (
                        not args.uid or pod_uid(pod) == args.uid):
                    return
            raise BindError(f"cannot create the Binding: {e}") from None

    async def _unpatch(self, args: BindingArgs, written: dict[str, Any], ptime: str, keys: list[str]) -> None:
        """Best effort: take back the annotations this bind wrote, unless someone wrote newer ones."""
        pod = written
        for _ in range(2):
            if podspec.pod_annotations(pod).get(podspec.ANN_PREDICATE_TIME) != ptime:
                return
            if (pod.get("spec") or {}).get("nodeName"):
                return  # bound after all (a lost answer): its annotations record what it holds; keep them
            rv = (pod.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": rv, "annotations": dict.fromkeys(keys)}}
            try:
                await self.access.patch_pod(args.namespace, args.name, patch)
                return
            except ApiCallError as e:
                if e.status != 409:
                    log.warning("pod %s/%s: cannot remove the annotations of a failed bind: %s",
                                args.namespace, args.name, e)
                    return
            try:
                pod = await self.access.get_pod(args.namespace, args.name)
            except ApiCallError:
                return
