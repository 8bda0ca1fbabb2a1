"""Bind: choose the pod's cards on the node, assume them, record them on the pod, then create the Binding.

Choosing and assuming happen in one step without an await, under the node's lock, so two binds to one node
can never take the same card; the API calls happen outside the lock. The pod's annotations are patched with
its resourceVersion (a merge patch): on 409 the pod is read again and the patch retried, a bounded number of
times. Any failure gives back what was assumed and removes the annotations written, and is answered as the
extender API wants it: HTTP 200 with `Error`.

Binds the extender must never make are refused before anything is assumed or written (`BindRefused`, a 4xx):
a pod that asks for no vcuda resource nor MIG instance, or names another scheduler (403), a pod already bound
(409), a node that does not exist or has no usable GPU inventory (422). With leader election, `guard` is asked
right before each API write (the annotations, the Binding): a replica that is no longer the leader, or has not
renewed its Lease in time, or leads in another term than when the bind began, writes nothing more (503);
annotations it already wrote are taken back, best effort.

The Binding carries the resourceVersion of the pod as this bind's annotation patch left it: the API server
binds only that version (409 otherwise). So a deposed leader whose Binding arrives late cannot bind a pod whose
annotations a newer leader has rewritten for another node.

Each bind runs in a task of its own: a handler cancelled at shutdown does not cut a bind between its writes;
`settle()` waits for the binds still running, and says whether any had to be cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from gpumgr.allocator import Allocation
from gpumgr.extender.ask import AskError, PodAsk, pod_ask, pod_uid
from gpumgr.extender.cluster import ClusterView
from gpumgr.extender.kubeaccess import ApiCallError
from gpumgr.extender.wire import BindingArgs
from gpumgr.requests import podspec
from gpumgr.requests.mig_ask import mig_asks

if TYPE_CHECKING:
    from gpumgr.extender.podcalls import PodCalls

log = logging.getLogger(__name__)

PATCH_ATTEMPTS = 5
DEFAULT_SCHEDULER = "gpumgr-scheduler"


class BindError(Exception):
    pass


class NotLeading(BindError):
    """The leader-election guard said no: answered 503."""


class BindRefused(Exception):
    """A bind this extender never makes; answered with `status` (4xx) and a JSON `Error`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


Guard = Callable[[], tuple[str, Hashable]]  # (why this replica must not write now or "", its leadership term)


class Binder:
    def __init__(self, view: ClusterView, access: PodCalls, attempts: int = PATCH_ATTEMPTS,
                 scheduler_name: str = DEFAULT_SCHEDULER, guard: Guard | None = None):
        self.guard = guard
        self.view = view
        self.access = access
        self.attempts = attempts
        self.scheduler_name = scheduler_name
        self._locks: dict[str, asyncio.Lock] = {}
        self._running: set[asyncio.Task[str]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the binds still running; cancel those left. True when every one
        finished by itself (nothing this replica sent can still change the cluster)."""
        running = set(self._running)
        if not running:
            return True
        _done, left = await asyncio.wait(running, timeout=timeout)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
        return not left

    async def bind(self, args: BindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error for the scheduler. Raises BindRefused."""
        task = asyncio.get_running_loop().create_task(self._bind_logged(args))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def _bind_logged(self, args: BindingArgs) -> str:
        where = f"pod {args.namespace}/{args.name} to node {args.node}"
        try:
            await self._bind(args)
        except NotLeading as e:
            log.warning("bind %s stopped: %s", where, e)
            raise BindRefused(503, str(e)) from None
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
            self._check_leading()
            await self._create_binding(args, "")
            log.info("bound pod %s/%s to node %s (no GPU)", args.namespace, args.name, args.node)
            return
        uid = pod_uid(pod)
        lock = self._locks.setdefault(args.node, asyncio.Lock())
        async with lock:
            term = self._check_leading()
            ptime, cards, annotations = self._assume(uid, ask, args.node)
        done = False
        try:
            written = await self._patch(args, pod, annotations, term)
            try:
                self._check_leading(term)
                await self._create_binding(args, _version(written), (ptime, term))
            except BindError:
                await self._unpatch(args, written, ptime, list(annotations))
                raise
            done = True
        finally:
            if not done:  # failed, or cancelled: give back what was assumed
                self.view.forget(uid, ptime)
        log.info("bound pod %s/%s to node %s: %s", args.namespace, args.name, args.node,
                 ", ".join(f"container {n}: cards {c}" for n, c in cards))

    def _check_leading(self, term: Hashable = None) -> Hashable:
        """Right before an API write, without awaiting until the write is sent. With `term` (what the first
        check returned), leading now is not enough: it must be the same, unbroken leadership."""
        if self.guard is None:
            return None
        why, now = self.guard()
        if why:
            raise NotLeading(why)
        if term is not None and now != term:
            raise NotLeading("this gpumgr extender replica stopped leading and leads again since the bind began; "
                             "the scheduler retries it")
        return now

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
        if not gpu and not _asks_mig(pod):
            raise BindRefused(403, f"the pod asks for no {podspec.RESOURCE_CORE}, {podspec.RESOURCE_MEMORY} or MIG "
                              "instance (<prefix>mig-<profile>); this extender binds only pods that do")
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

    async def _patch(self, args: BindingArgs, pod: dict[str, Any], annotations: dict[str, str],
                     term: Hashable) -> dict[str, Any]:
        """Write the annotations with optimistic concurrency; returns the patched pod."""
        for attempt in range(1, self.attempts + 1):
            meta = pod.get("metadata") or {}
            values: dict[str, str | None] = {
                k: None for k in podspec.pod_annotations(pod)
                if k.startswith(podspec.ANN_PREDICATE_IDX) and k not in annotations
            }
            values.update(annotations)
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": values}}
            if attempt > 1:
                self._check_leading(term)
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

    async def _create_binding(self, args: BindingArgs, resource_version: str,
                              ours: tuple[str, Hashable] | None = None) -> None:
        """With `ours` (this bind's predicate time and term), a 409 because the pod was written since the
        annotation patch (another controller's label, ...) is retried with the new resourceVersion, as long as
        the pod still carries this bind's annotations and this replica still leads in the same term."""
        for attempt in range(1, self.attempts + 1):
            try:
                await self.access.bind_pod(args.namespace, args.name, args.uid, args.node, resource_version)
                return
            except ApiCallError as e:
                if e.status != 409 or ours is None or attempt == self.attempts:
                    await self._binding_failed(args, e)
                    return
                pod = await self._read(args)
                ann = podspec.pod_annotations(pod)
                still = (ann.get(podspec.ANN_PREDICATE_TIME) == ours[0] and ann.get(podspec.ANN_PREDICATE_NODE)
                         == args.node and not (pod.get("spec") or {}).get("nodeName")
                         and (not args.uid or pod_uid(pod) == args.uid))
                if not still:
                    raise BindError(f"cannot create the Binding: {e} (the pod was bound or its cards rewritten "
                                    "meanwhile)") from None
                log.info("pod %s/%s changed before its Binding (attempt %d); binding its new version",
                         args.namespace, args.name, attempt)
                resource_version = _version(pod)
                self._check_leading(ours[1])

    async def _binding_failed(self, args: BindingArgs, e: ApiCallError) -> None:
        """Return when the Binding was made after all (an answer lost); else raise BindError."""
        if e.status in (0, 500, 503, 504):  # no clear answer: the Binding may have been made after all
            try:
                pod = await self.access.get_pod(args.namespace, args.name)
            except ApiCallError:
                pod = {}
            if (pod.get("spec") or {}).get("nodeName") == args.node and (not args.uid or pod_uid(pod) == args.uid):
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


def _version(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("resourceVersion") or "")


def _asks_mig(pod: dict[str, Any]) -> bool:
    """A pod asking MIG instances of the device plugins (bound as it is: the kubelet picks the instance)."""
    try:
        return bool(mig_asks(pod))
    except ValueError:
        return True  # unreadable: pod_ask and the filter report it
