"""A stand-in for kube-scheduler's DRA allocator (structured parameters, consumable capacity), over the test API
server's store. Used by the DRA end-to-end tests, the bench and (later) the demo.

    sched = DraScheduler(api.store)
    node = sched.schedule_pod("default", "train")     # claims from templates, allocation, reservedFor, binding

What it does as the real allocator does:
- candidates: devices of the newest generation of each pool in the ResourceSlices of a node;
- a device matches a request when every selector of the request's DeviceClass and of the request (CEL, through
  cel-python) is true, it has no NoSchedule/NoExecute taint the request does not tolerate, and it has every
  capacity the request asks for;
- consumable capacity: the amount a request takes is its request rounded by the capacity's requestPolicy
  (validRange: below min -> min, else min + ceil((x - min) / step) * step, above max -> no; validValues: the next
  listed value), or the policy's default when it asks none (no policy: the whole value); it fits when the
  running total of every allocated claim's `consumedCapacity` on that device leaves room;
  `allowMultipleAllocations: false` devices go to one claim only;
- partitionable devices: a device's `consumesCounters` must fit in what is left of its pool's `sharedCounters`
  (published in their own slices or beside the devices), counting every allocated device once: the shares of a
  multi-allocatable device consume its counters once, with the first (a further share checks no counters);
- constraints: `matchAttribute` (every chosen device has the same value) and `distinctAttribute`;
- `allocationMode: All` takes every matching device; `ExactCount` `count` devices (default 1);
- the result: `status.allocation.devices.results[]` with `shareID` (a random DNS label) and `consumedCapacity`
  for shared devices, a node selector, and the pod in `status.reservedFor`.
Every claim of the pod is allocated on one node or none is (nothing written). Not done: `firstAvailable`,
admin access, prioritised node scoring (first node that fits wins).
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumgr.requests.quantity import QuantityError, format_bytes, parse_int
from gpumgr.sim.dra_cel import CelError, SelectorCache, device_activation
from gpumgr.sim.kubeapi import ApiError, KubeStore

MAX_SELECTORS = 32  # resource.k8s.io/v1 DeviceSelectorsMaxSize (a class's and a request's list each)

Obj = dict[str, Any]
MAX_SEARCH = 100_000  # device combinations tried per pod before giving up


class Unschedulable(Exception):
    """No node can hold every claim of the pod; the message says why (per node)."""


class DraScheduler:
    def __init__(self, store: KubeStore):
        self.store = store
        self.cel = SelectorCache()

    # -- pods ----------------------------------------------------------------------------------------------
    def claim_names(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """The pod's claims: pod-level claim name -> ResourceClaim name (templates resolved via pod status)."""
        statuses = {s.get("name"): s.get("resourceClaimName")
                    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        out = {}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            if name:
                out[ref["name"]] = name
        return out

    def create_template_claims(self, namespace: str, pod_name: str) -> dict[str, str]:
        """What the resourceclaim controller does: one claim per template reference, owned by the pod."""
        pod = self._pod(namespace, pod_name)
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        have = {s.get("name") for s in statuses}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            template_name = ref.get("resourceClaimTemplateName")
            if not template_name or ref["name"] in have:
                continue
            template = self.store.get_object("resourceclaimtemplates", template_name, namespace)
            if template is None:
                raise Unschedulable(f"pod {namespace}/{pod_name}: ResourceClaimTemplate {template_name} not found")
            claim = self.store.create_object("resourceclaims", {
                "metadata": {"generateName": f"{pod_name}-{ref['name']}-"[:58], "namespace": namespace,
                             "annotations": {"resource.kubernetes.io/pod-claim-name": ref["name"]},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                                  "uid": pod["metadata"]["uid"], "controller": True}]},
                "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {})}, namespace)
            statuses.append({"name": ref["name"], "resourceClaimName": claim["metadata"]["name"]})
        self.store.merge_patch_pod(namespace, pod_name, {"status": {"resourceClaimStatuses": statuses}})
        return self.claim_names(self._pod(namespace, pod_name))

    def schedule_pod(self, namespace: str, pod_name: str, nodes: Sequence[str] | None = None) -> str:
        """Allocate every claim of the pod on one node, reserve them for the pod, bind it. Raises Unschedulable
        (and writes nothing) when no node fits."""
        self.create_template_claims(namespace, pod_name)
        pod = self._pod(namespace, pod_name)
        claims = []
        for name in self.claim_names(pod).values():
            claim = self.store.get_object("resourceclaims", name, namespace)
            if claim is None:
                raise Unschedulable(f"pod {namespace}/{pod_name}: ResourceClaim {name} not found")
            claims.append(claim)
        candidates = list(nodes) if nodes is not None else sorted(self._slice_nodes())
        reasons = {}
        for node in candidates:
            try:
                plans = self._plan_node(node, claims)
            except Unschedulable as e:
                reasons[node] = str(e)
                continue
            for claim, results in plans:
                self._write(claim, node, results, pod)
            self.store.bind_pod(namespace, pod_name, node)
            return node
        why = "; ".join(f"{n}: {r}" for n, r in reasons.items()) or "no node publishes ResourceSlices"
        raise Unschedulable(f"pod {namespace}/{pod_name}: {why}")

    def release_pod(self, namespace: str, pod: Mapping[str, Any]) -> None:
        """After the pod is gone: drop it from reservedFor; deallocate claims nobody reserves; delete the claims
        made from templates for it."""
        uid = pod["metadata"]["uid"]
        generated = {s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        for name in self.claim_names(pod).values():
            claim = self.store.get_object("resourceclaims", name, namespace)
            if claim is None:
                continue
            status = claim.get("status") or {}
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
            if name in generated:
                self.store.delete_object("resourceclaims", name, namespace)
            elif reserved:
                self.store.merge_patch_object("resourceclaims", name, {"status": {"reservedFor": reserved}},
                                              namespace)
            else:
                self.store.merge_patch_object("resourceclaims", name, {"status": None}, namespace)

    # -- claims ----------------------------------------------------------------------------------------------
    def allocate_claim(self, namespace: str, name: str, node: str, pod: Mapping[str, Any] | None = None) -> Obj:
        """Allocate one claim on `node` (reserving it for `pod` when given). Raises Unschedulable."""
        claim = self.store.get_object("resourceclaims", name, namespace)
        if claim is None:
            raise Unschedulable(f"ResourceClaim {namespace}/{name} not found")
        [(claim, results)] = self._plan_node(node, [claim])
        return self._write(claim, node, results, pod)

    def _write(self, claim: Obj, node: str, results: list[Obj] | None, pod: Mapping[str, Any] | None) -> Obj:
        meta = claim["metadata"]
        status = copy.deepcopy(claim.get("status") or {})
        if results is not None:
            status["allocation"] = {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
        if pod is not None:
            reserved = list(status.get("reservedFor") or [])
            pm = pod["metadata"]
            if not any(r.get("uid") == pm["uid"] for r in reserved):
                reserved.append({"resource": "pods", "name": pm["name"], "uid": pm["uid"]})
            status["reservedFor"] = reserved
        return self.store.merge_patch_object("resourceclaims", meta["name"], {"status": status},
                                             meta.get("namespace"))

    # -- allocation ------------------------------------------------------------------------------------------
    def _plan_node(self, node: str, claims: list[Obj]) -> list[tuple[Obj, list[Obj] | None]]:
        """Results for each claim on `node` (None: already allocated there), or Unschedulable."""
        devices = self._node_devices(node)
        usage = self._usage()
        counters = Counters(self._node_counters(node), {c.key: c for c in devices})
        counters.add_allocated(self.store.list_resource("resourceclaims"))
        plans: list[tuple[Obj, list[Obj] | None]] = []
        for claim in claims:
            label = f"claim {claim['metadata'].get('namespace')}/{claim['metadata']['name']}"
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                on = _allocated_node(allocation)
                if on not in (None, node):
                    raise Unschedulable(f"{label} is allocated on node {on}")
                plans.append((claim, None))
                continue
            results = self._solve(label, claim, devices, usage, counters)
            for r in results:  # later claims of the same pod see these
                key = (r["pool"], r["device"])
                usage.setdefault(key, Usage()).add(r)
                counters.take(key, 1)
            plans.append((claim, results))
        return plans

    def _solve(self, label: str, claim: Obj, devices: list[Candidate], usage: dict[tuple[str, str], Usage],
               counters: Counters) -> list[Obj]:
        spec = (claim.get("spec") or {}).get("devices") or {}
        requests = spec.get("requests") or []
        picks_per_request: list[tuple[str, list[tuple[Candidate, dict[str, int]]], int | None]] = []
        for req in requests:
            exact = req.get("exactly")
            if not isinstance(exact, dict):
                raise Unschedulable(f"{label}: request {req.get('name')}: only `exactly` requests are supported")
            matching = self._matching(label, req["name"], exact, devices)
            mode = exact.get("allocationMode") or "ExactCount"
            count = None if mode == "All" else int(exact.get("count") or 1)
            if count is None and not matching:
                raise Unschedulable(f"{label}: request {req['name']}: no device matches (allocationMode All)")
            picks_per_request.append((req["name"], matching, count))
        constraints = spec.get("constraints") or []
        chosen: list[tuple[str, Candidate, dict[str, int]]] = []
        budget = [MAX_SEARCH]
        local: dict[tuple[str, str], Usage] = {}

        def fits(c: Candidate, amounts: dict[str, int]) -> bool:
            used = usage.get(c.key, Usage())
            mine = local.get(c.key, Usage())
            if not counters.fits(c):
                return False
            if not c.shared:
                return not used.claims and not mine.claims
            return all(used.amounts.get(k, 0) + mine.amounts.get(k, 0) + v <= c.capacity.get(k, 0)
                       for k, v in amounts.items())

        def constraints_ok() -> bool:
            for con in constraints:
                names = set(con.get("requests") or [])
                picked = [c for r, c, _ in chosen if not names or r in names]
                if con.get("matchAttribute"):
                    values = [c.attribute(con["matchAttribute"]) for c in picked]
                    if any(v is None for v in values) or len({repr(v) for v in values}) > 1:
                        return False
                if con.get("distinctAttribute"):
                    values = [c.attribute(con["distinctAttribute"]) for c in picked]
                    if any(v is None for v in values) or len({repr(v) for v in values}) != len(values):
                        return False
            return True

        def search(ri: int, need: int, start: int) -> bool:
            budget[0] -= 1
            if budget[0] <= 0:
                return False
            if ri == len(picks_per_request):
                return True
            name, matching, count = picks_per_request[ri]
            if need == 0:
                following = _need(picks_per_request[ri + 1]) if ri + 1 < len(picks_per_request) else 0
                return search(ri + 1, following, 0)
            for i in range(start, len(matching)):
                c, amounts = matching[i]
                if not fits(c, amounts):
                    if count is None:
                        return False
                    continue
                chosen.append((name, c, amounts))
                local.setdefault(c.key, Usage()).add_amounts(amounts)
                counters.take(c.key, 1)
                if constraints_ok() and search(ri, need - 1, i + 1):
                    return True
                chosen.pop()
                local[c.key].remove_amounts(amounts)
                counters.take(c.key, -1)
                if count is None:
                    return False
            return False

        found = not picks_per_request or search(0, _need(picks_per_request[0]), 0)
        for _, c, _ in chosen:  # the caller counts what it keeps
            counters.take(c.key, -1)
        if not found:
            raise Unschedulable(f"{label}: no set of devices satisfies its requests"
                                f"{' and constraints' if constraints else ''} with the capacity left"
                                + _why(picks_per_request))
        results = []
        for name, c, amounts in chosen:
            r: Obj = {"request": name, "driver": c.driver, "pool": c.pool, "device": c.name}
            if c.shared:
                r["shareID"] = secrets.token_hex(4)
                r["consumedCapacity"] = {k: (format_bytes(v) if k.endswith("memory") else str(v))
                                         for k, v in amounts.items()}
            results.append(r)
        return results

    def _matching(self, label: str, request: str, exact: Mapping[str, Any], devices: list[Candidate]) \
            -> list[tuple[Candidate, dict[str, int]]]:
        class_name = exact.get("deviceClassName")
        dclass = self.store.get_object("deviceclasses", str(class_name)) if class_name else None
        if dclass is None:
            raise Unschedulable(f"{label}: request {request}: DeviceClass {class_name!r} not found")
        try:
            selectors = _cel_expressions((dclass.get("spec") or {}).get("selectors")) \
                + _cel_expressions(exact.get("selectors"))
        except CelError as e:
            raise Unschedulable(f"{label}: request {request}: {e}") from None
        asked = {k: v for k, v in ((exact.get("capacity") or {}).get("requests") or {}).items()}
        tolerations = list(exact.get("tolerations") or [])
        out = []
        for c in devices:
            if not _tolerated(c.taints, tolerations):
                continue
            try:
                if not all(self.cel.matches(e, c.activation) for e in selectors):
                    continue
            except CelError as e:
                raise Unschedulable(f"{label}: request {request}: {e}") from None
            amounts = c.amounts_for(asked) if c.shared else {}
            if amounts is None:
                continue
            out.append((c, amounts))
        return out

    # -- cluster state ---------------------------------------------------------------------------------------
    def _node_devices(self, node: str) -> list[Candidate]:
        out = [Candidate.from_device(sp["driver"], sp["pool"]["name"], d)
               for sp in self._newest_specs(node) for d in sp.get("devices") or []]
        return sorted(out, key=lambda c: (c.pool, _natural(c.name)))

    def _node_counters(self, node: str) -> dict[tuple[str, str, str], int]:
        """(pool, counter set, counter) -> capacity, from the newest generation of the node's slices."""
        return {(sp["pool"]["name"], str(cs["name"]), name): parse_int((v or {}).get("value", 0))
                for sp in self._newest_specs(node) for cs in sp.get("sharedCounters") or []
                for name, v in (cs.get("counters") or {}).items()}

    def _newest_specs(self, node: str) -> list[Obj]:
        """The specs of the node's slices of each pool's newest generation (older ones are being replaced)."""
        specs = [s["spec"] for s in self.store.list_resource("resourceslices")
                 if (s.get("spec") or {}).get("nodeName") == node]
        newest: dict[tuple[str, str], int] = {}
        for sp in specs:
            key = (sp["driver"], sp["pool"]["name"])
            newest[key] = max(newest.get(key, 0), int(sp["pool"].get("generation") or 0))
        return [sp for sp in specs
                if int(sp["pool"].get("generation") or 0) == newest[(sp["driver"], sp["pool"]["name"])]]

    def _slice_nodes(self) -> set[str]:
        return {str((s.get("spec") or {}).get("nodeName")) for s in self.store.list_resource("resourceslices")
                if (s.get("spec") or {}).get("nodeName")}

    def _usage(self) -> dict[tuple[str, str], Usage]:
        usage: dict[tuple[str, str], Usage] = {}
        for claim in self.store.list_resource("resourceclaims"):
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for r in (allocation.get("devices") or {}).get("results") or []:
                usage.setdefault((r.get("pool"), r.get("device")), Usage()).add(r)
        return usage

    def _pod(self, namespace: str, name: str) -> Obj:
        pod = self.store.get_pod(namespace, name)
        if pod is None:
            raise Unschedulable(f"pod {namespace}/{name} not found")
        return pod


def _need(entry: tuple[str, list[Any], int | None]) -> int:
    return len(entry[1]) if entry[2] is None else entry[2]


def _why(picks: list[tuple[str, list[Any], int | None]]) -> str:
    empty = [name for name, matching, _ in picks if not matching]
    return f" (no device matches request {', '.join(empty)})" if empty else ""


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


def _allocated_node(allocation: Mapping[str, Any]) -> str | None:
    for term in ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []):
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None


def _tolerated(taints: Iterable[Mapping[str, Any]], tolerations: list[Mapping[str, Any]]) -> bool:
    for t in taints:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(tol, t) for tol in tolerations):
            return False
    return True


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("key") and tol["key"] != taint.get("key"):
        return False
    if (tol.get("operator") or "Equal") == "Exists":
        return True
    return bool(tol.get("value", "") == taint.get("value", "") and tol.get("key"))


def round_request(asked: int | None, value: int, policy: Mapping[str, Any] | None) -> int | None:
    """The amount a request takes under a requestPolicy, or None when it cannot be met."""
    if not policy:
        amount = value if asked is None else asked
        return amount if amount <= value else None
    if asked is None:
        asked = parse_int(policy["default"]) if policy.get("default") is not None else value
    valid_values = policy.get("validValues")
    if valid_values:
        options = sorted(parse_int(v) for v in valid_values)
        return next((v for v in options if v >= asked), None)
    rng = policy.get("validRange")
    if rng:
        low = parse_int(rng.get("min", 0))
        step = parse_int(rng["step"]) if rng.get("step") is not None else None
        if asked <= low:
            amount = low
        elif step:
            amount = low + -(-(asked - low) // step) * step
        else:
            amount = asked
        high = parse_int(rng["max"]) if rng.get("max") is not None else value
        return amount if amount <= min(high, value) else None
    return asked if asked <= value else None


@dataclass
class Usage:
    claims: int = 0
    amounts: dict[str, int] = field(default_factory=dict)

    def add(self, result: Mapping[str, Any]) -> None:
        self.claims += 1
        for k, v in (result.get("consumedCapacity") or {}).items():
            try:
                self.amounts[k] = self.amounts.get(k, 0) + parse_int(v)
            except QuantityError:  # the real API server never stores one; a test may
                continue

    def add_amounts(self, amounts: Mapping[str, int]) -> None:
        self.claims += 1
        for k, v in amounts.items():
            self.amounts[k] = self.amounts.get(k, 0) + v

    def remove_amounts(self, amounts: Mapping[str, int]) -> None:
        self.claims -= 1
        for k, v in amounts.items():
            self.amounts[k] -= v


@dataclass
class Counters:
    """What is left of the pools' shared counters: capacity minus every taken device's consumption."""

    capacity: dict[tuple[str, str, str], int]
    devices: dict[tuple[str, str], Candidate]
    used: dict[tuple[str, str, str], int] = field(default_factory=dict)
    allocations: dict[tuple[str, str], int] = field(default_factory=dict)  # device -> results naming it

    def add_allocated(self, claims: Iterable[Mapping[str, Any]]) -> None:
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for r in (allocation.get("devices") or {}).get("results") or []:
                self.take((str(r.get("pool")), str(r.get("device"))), 1)

    def take(self, key: tuple[str, str], sign: int) -> None:
        """One more (sign 1) or one less (-1) allocation of the device; its counters are consumed by the first and
        given back with the last (a multi-allocatable device's shares consume them once, as kube-scheduler does)."""
        before = self.allocations.get(key, 0)
        after = before + sign
        self.allocations[key] = after
        c = self.devices.get(key)
        if c is None or (before == 0) == (after == 0):
            return
        for (cset, name), amount in c.consumes.items():
            k = (c.pool, cset, name)
            self.used[k] = self.used.get(k, 0) + sign * amount

    def fits(self, c: Candidate) -> bool:
        if c.shared and self.allocations.get(c.key, 0) > 0:
            return True  # already allocated (and its counters consumed): a further share consumes none
        return all(self.used.get((c.pool, cset, name), 0) + amount <= self.capacity.get((c.pool, cset, name), -1)
                   for (cset, name), amount in c.consumes.items())


@dataclass
class Candidate:
    driver: str
    pool: str
    name: str
    shared: bool
    capacity: dict[str, int]
    policies: dict[str, Mapping[str, Any] | None]
    attributes: dict[str, Any]
    taints: list[Mapping[str, Any]]
    activation: Any
    consumes: dict[tuple[str, str], int] = field(default_factory=dict)  # (counter set, counter) -> amount

    @property
    def key(self) -> tuple[str, str]:
        return self.pool, self.name

    def attribute(self, qualified: str) -> Any:
        domain, _, short = qualified.rpartition("/")
        value = self.attributes.get(qualified)
        if value is None and domain == self.driver:
            value = self.attributes.get(short)
        return value

    def amounts_for(self, asked: Mapping[str, Any]) -> dict[str, int] | None:
        """What a request asking `asked` takes from each capacity of this device, or None if it cannot."""
        amounts = {}
        for k in asked:
            if k not in self.capacity and k.rpartition("/")[2] not in self.capacity:
                return None
        for k, value in self.capacity.items():
            raw = asked.get(k, asked.get(f"{self.driver}/{k}"))
            try:
                want = parse_int(raw) if raw is not None else None
                amount = round_request(want, value, self.policies.get(k))
            except QuantityError:
                return None
            if amount is None:
                return None
            amounts[k] = amount
        return amounts

    @classmethod
    def from_device(cls, driver: str, pool: str, d: Mapping[str, Any]) -> Candidate:
        capacity = {k: parse_int((v or {}).get("value", 0)) for k, v in (d.get("capacity") or {}).items()}
        policies = {k: (v or {}).get("requestPolicy") for k, v in (d.get("capacity") or {}).items()}
        attributes = {k: next(iter(v.values()), None) if isinstance(v, dict) and v else None
                      for k, v in (d.get("attributes") or {}).items()}
        consumes = {(str(cc.get("counterSet")), name): parse_int((v or {}).get("value", 0))
                    for cc in d.get("consumesCounters") or [] for name, v in (cc.get("counters") or {}).items()}
        return cls(driver=driver, pool=pool, name=str(d["name"]), shared=bool(d.get("allowMultipleAllocations")),
                   capacity=capacity, policies=policies, attributes=attributes, taints=list(d.get("taints") or []),
                   activation=device_activation(driver, d), consumes=consumes)


__all__ = ["ApiError", "DraScheduler", "Unschedulable", "round_request"]


def _cel_expressions(selectors: Any) -> list[Any]:
    """The CEL expressions of a list of DeviceSelectors (each `{"cel": {"expression": ...}}`); CelError when the
    list or a selector is not shaped so (the API server would have refused it)."""
    if selectors is None:
        return []
    if not isinstance(selectors, list) or len(selectors) > MAX_SELECTORS:
        raise CelError(f"selectors must be a list of at most {MAX_SELECTORS}")
    out = []
    for s in selectors:
        if not isinstance(s, Mapping):
            raise CelError("a selector must be an object")
        cel = s.get("cel")
        if cel is None:
            continue
        if not isinstance(cel, Mapping) or "expression" not in cel:
            raise CelError("a selector's cel must be an object with an expression")
        out.append(cel["expression"])
    return out
