"""The resources the test API server knows, and the rules it applies to objects on create and update.

Pure functions on JSON dicts: the caller (the store) supplies time, UIDs and name suffixes and holds the lock.
Rules follow the real API server where our clients could notice the difference:
- create drops `status` of pods (a new pod is `Pending`), keeps it for nodes, applies a few pod defaults;
- an update of the main resource keeps the old `status`; the `status` subresource changes only `status`;
- a pod's spec is immutable apart from images, tolerations, `activeDeadlineSeconds` and scheduling gates;
  `spec.nodeName` is set only by a binding;
- labels and annotations must be string maps (400 otherwise), names must be DNS subdomains (422);
- `resource.k8s.io/v1` objects (ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass) carry
  `metadata.generation`, bumped when the spec changes; a ResourceClaim's spec is immutable and its `status`
  (allocation, reservedFor, devices) is written through the status subresource only;
- `coordination.k8s.io/v1` Leases (namespaced, no status) check the types of their spec fields; like every
  object, a replace or patch carrying a stale `metadata.resourceVersion` is refused with 409 Conflict.
"""

from __future__ import annotations

import copy
import functools
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumgr.sim.kubeapi.capacity import check_device_capacity
from gpumgr.sim.kubeapi.errors import ApiError, bad_request, invalid

FieldGetter = Callable[[dict[str, Any]], str]

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_POD_MUTABLE_SPEC = frozenset({"activeDeadlineSeconds", "tolerations", "schedulingGates",
                               "terminationGracePeriodSeconds"})


@functools.cache
def resource_kinds() -> Mapping[str, ResourceKind]:
    """Resource plural -> how the server treats it."""
    pods = ResourceKind(
        plural="pods", kind="Pod", namespaced=True, has_status=True, returns_deleted_object=True,
        fields=_getters("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
                        "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                        "status.podIP", "status.nominatedNodeName"))
    nodes = ResourceKind(
        plural="nodes", kind="Node", namespaced=False, has_status=True, returns_deleted_object=False,
        fields=_getters("metadata.name", "spec.unschedulable"))
    events = ResourceKind(
        plural="events", kind="Event", namespaced=True, has_status=False, returns_deleted_object=False,
        fields=_getters("metadata.name", "metadata.namespace", "involvedObject.kind",
                        "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                        "involvedObject.apiVersion", "involvedObject.resourceVersion",
                        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"))
    slices = ResourceKind(
        plural="resourceslices", kind="ResourceSlice", namespaced=False, has_status=False,
        returns_deleted_object=True, group=RESOURCE_GROUP,
        fields=_getters("metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"))
    claims = ResourceKind(
        plural="resourceclaims", kind="ResourceClaim", namespaced=True, has_status=True,
        returns_deleted_object=True, group=RESOURCE_GROUP, fields=_getters("metadata.name", "metadata.namespace"))
    templates = ResourceKind(
        plural="resourceclaimtemplates", kind="ResourceClaimTemplate", namespaced=True, has_status=False,
        returns_deleted_object=True, group=RESOURCE_GROUP, fields=_getters("metadata.name", "metadata.namespace"))
    classes = ResourceKind(
        plural="deviceclasses", kind="DeviceClass", namespaced=False, has_status=False,
        returns_deleted_object=True, group=RESOURCE_GROUP, fields=_getters("metadata.name"))
    leases = ResourceKind(
        plural="leases", kind="Lease", namespaced=True, has_status=False, returns_deleted_object=False,
        group=COORDINATION_GROUP, fields=_getters("metadata.name", "metadata.namespace"))
    return types.MappingProxyType({k.plural: k for k in (pods, nodes, events, slices, claims, templates, classes,
                                                         leases)})


RESOURCE_GROUP = "resource.k8s.io"
COORDINATION_GROUP = "coordination.k8s.io"
GROUPS = (RESOURCE_GROUP, COORDINATION_GROUP)  # the API groups served besides the core group, as /apis lists them
MAX_SLICE_DEVICES = 128


def _getters(*paths: str) -> Mapping[str, FieldGetter]:
    return types.MappingProxyType({p: _getter(p) for p in paths})


def _getter(path: str) -> FieldGetter:
    keys = path.split(".")

    def get(obj: dict[str, Any]) -> str:
        cur: Any = obj
        for key in keys:
            cur = cur.get(key) if isinstance(cur, dict) else None
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        if isinstance(cur, dict):  # an event's `source` selects on its component
            return str(cur.get("component", ""))
        return str(cur)

    return get


def check_namespace(namespace: str) -> None:
    if len(namespace) > 63 or not _LABEL.match(namespace):
        raise bad_request(f"invalid namespace {namespace!r}: must be a DNS label "
                          "(lowercase letters, digits, '-')")


def decode_body(kind: ResourceKind, body: Any) -> dict[str, Any]:
    """Check the shape of a request object: a JSON object of the right kind with string-map metadata."""
    if not isinstance(body, dict):
        raise bad_request(f"the body of a {kind.kind} request must be a JSON object")
    if body.get("kind") not in (None, "", kind.kind):
        raise bad_request(f"the kind in the body ({body.get('kind')}) does not match the expected kind "
                          f"{kind.kind}")
    if body.get("apiVersion") not in (None, "", kind.api_version):
        raise bad_request(f"the API version in the body ({body.get('apiVersion')}) does not match the "
                          f"expected API version ({kind.api_version})")
    check_metadata_types(body)
    return body


def check_metadata_types(obj: dict[str, Any]) -> None:
    meta = obj.get("metadata", {})
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise bad_request("metadata must be a JSON object")
    for key in ("name", "namespace", "generateName", "resourceVersion", "uid"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise bad_request(f"metadata.{key} must be a string, got {type(meta[key]).__name__}")
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise bad_request(f"metadata.{key} must be an object of strings")
        for k, v in value.items():
            if not isinstance(v, str):
                raise bad_request(f"metadata.{key}[{k!r}] must be a string, got {type(v).__name__} "
                                  f"({json_type_hint(v)})")


def json_type_hint(value: Any) -> str:
    return "quote the value" if isinstance(value, int | float | bool) else "use a string"


def validate(kind: ResourceKind, obj: dict[str, Any]) -> None:
    """Field validation that the real server answers with 422 Invalid."""
    meta = obj["metadata"]
    name = meta["name"]
    if len(name) > 253 or not _SUBDOMAIN.match(name):
        raise invalid(kind.plural, name, f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 "
                      "subdomain must consist of lower case alphanumeric characters, '-' or '.'")
    for key, value in (meta.get("labels") or {}).items():
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise invalid(kind.plural, name, f"metadata.labels: Invalid value: {value!r} (label {key!r})")
    if kind.plural == "pods":
        containers = (obj.get("spec") or {}).get("containers")
        if not isinstance(containers, list) or not containers:
            raise invalid(kind.plural, name, "spec.containers: Required value")
        seen: set[str] = set()
        for i, c in enumerate(containers + list((obj.get("spec") or {}).get("initContainers") or [])):
            cname = c.get("name") if isinstance(c, dict) else None
            if not isinstance(cname, str) or not cname:
                raise invalid(kind.plural, name, f"spec.containers[{i}].name: Required value")
            if cname in seen:
                raise invalid(kind.plural, name, f"spec.containers[{i}].name: Duplicate value: {cname!r}")
            seen.add(cname)
    if kind.plural == "events" and not isinstance(obj.get("involvedObject"), dict):
        raise invalid(kind.plural, name, "involvedObject: Required value")
    if kind.group == RESOURCE_GROUP:
        _validate_resource(kind, name, obj)
    if kind.plural == "leases":
        _validate_lease(name, obj)


_LEASE_INTS = ("leaseDurationSeconds", "leaseTransitions")
_LEASE_STRINGS = ("holderIdentity", "acquireTime", "renewTime", "preferredHolder", "strategy")


def _validate_lease(name: str, obj: dict[str, Any]) -> None:
    """The checks of the real server's Lease validation that a client can trip over."""
    spec = obj.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise bad_request("spec must be a JSON object")
    for key in _LEASE_INTS:
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise bad_request(f"spec.{key} must be an integer, got {type(value).__name__}")
    for key in _LEASE_STRINGS:
        value = spec.get(key)
        if value is not None and not isinstance(value, str):
            raise bad_request(f"spec.{key} must be a string, got {type(value).__name__}")
    if spec.get("leaseDurationSeconds") is not None and spec["leaseDurationSeconds"] <= 0:
        raise invalid("leases", name, f"spec.leaseDurationSeconds: Invalid value: {spec['leaseDurationSeconds']}: "
                      "must be greater than 0")
    if spec.get("leaseTransitions") is not None and spec["leaseTransitions"] < 0:
        raise invalid("leases", name, f"spec.leaseTransitions: Invalid value: {spec['leaseTransitions']}: "
                      "must be greater than or equal to 0")
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not _MICRO_TIME.match(value):
            raise bad_request(f"spec.{key}: {value!r} is not a time like 2006-01-02T15:04:05.000000Z")


def _validate_resource(kind: ResourceKind, name: str, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if kind.plural != "deviceclasses" and not isinstance(spec, dict):
        raise invalid(kind.plural, name, "spec: Required value")
    if spec is not None and not isinstance(spec, dict):
        raise invalid(kind.plural, name, "spec: Invalid value: must be an object")
    if kind.plural == "resourceslices":
        assert isinstance(spec, dict)
        if not isinstance(spec.get("driver"), str) or not spec["driver"]:
            raise invalid(kind.plural, name, "spec.driver: Required value")
        pool = spec.get("pool")
        if not isinstance(pool, dict) or not pool.get("name") or not isinstance(pool.get("generation", 0), int):
            raise invalid(kind.plural, name, "spec.pool: Required value: name and generation")
        devices = spec.get("devices") or []
        if not isinstance(devices, list) or len(devices) > MAX_SLICE_DEVICES:
            raise invalid(kind.plural, name, f"spec.devices: Too many: must have at most {MAX_SLICE_DEVICES} items")
        seen: set[str] = set()
        for i, d in enumerate(devices):
            dname = d.get("name") if isinstance(d, dict) else None
            if not isinstance(dname, str) or not _LABEL.match(dname) or len(dname) > 63:
                raise invalid(kind.plural, name, f"spec.devices[{i}].name: Invalid value: {dname!r}")
            if dname in seen:
                raise invalid(kind.plural, name, f"spec.devices[{i}].name: Duplicate value: {dname!r}")
            seen.add(dname)
            check_device_capacity(kind.plural, name, f"spec.devices[{i}]", d.get("capacity"),
                                  d.get("allowMultipleAllocations") is True)


def prepare_create(kind: ResourceKind, body: dict[str, Any], namespace: str | None, *, uid: str, now: str,
                   name_suffix: str) -> dict[str, Any]:
    """The object to store for a create request (without resourceVersion, which the store assigns)."""
    obj = copy.deepcopy(body)
    obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
    meta = obj.setdefault("metadata", {}) or {}
    obj["metadata"] = meta
    if meta.get("resourceVersion"):
        raise bad_request("resourceVersion should not be set on objects to be created")
    if kind.namespaced:
        assert namespace is not None
        if meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on "
                              "the request")
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    if not meta.get("name"):
        if not meta.get("generateName"):
            raise invalid(kind.plural, "", "metadata.name: Required value: name or generateName is required")
        meta["name"] = meta["generateName"] + name_suffix
    meta["uid"] = uid
    meta["creationTimestamp"] = now
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
        meta.pop(key, None)
    if kind.plural == "pods":
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("terminationGracePeriodSeconds", 30)
        obj["status"] = {"phase": "Pending"}
    if kind.group == RESOURCE_GROUP:
        meta["generation"] = 1
        if kind.has_status:
            obj.pop("status", None)
    if kind.plural == "events":
        obj.setdefault("firstTimestamp", now)
        obj.setdefault("lastTimestamp", now)
        obj.setdefault("count", 1)
    validate(kind, obj)
    return obj


def prepare_update(kind: ResourceKind, old: dict[str, Any], new: dict[str, Any], *,
                   status_only: bool) -> dict[str, Any]:
    """The object to store when `new` replaces `old` (through the main resource or its status)."""
    name = old["metadata"]["name"]
    new_meta = new.get("metadata") or {}
    if new_meta.get("name") not in (None, name):
        raise bad_request(f"the name of the object ({new_meta.get('name')}) does not match the name on the "
                          f"URL ({name})")
    if new_meta.get("uid") not in (None, "", old["metadata"]["uid"]):
        raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} "{name}": '
                       f"Precondition failed: UID in precondition: {new_meta['uid']}, UID in object meta: "
                       f"{old['metadata']['uid']}", {"name": name, "kind": kind.plural})
    if kind.namespaced and new_meta.get("namespace") not in (None, "", old["metadata"]["namespace"]):
        raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                          "request")
    if status_only:
        result = copy.deepcopy(old)
        if "status" in new:
            result["status"] = copy.deepcopy(new["status"])
        else:
            result.pop("status", None)
        return result
    result = copy.deepcopy(new)
    result["kind"], result["apiVersion"] = kind.kind, kind.api_version
    meta = result.setdefault("metadata", {})
    for key in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
    if kind.group == RESOURCE_GROUP and result.get("spec") != old.get("spec"):
        if kind.plural == "resourceclaims":
            raise invalid(kind.plural, name, "spec: Invalid value: field is immutable")
        meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
    if kind.has_status:
        if "status" in old:
            result["status"] = copy.deepcopy(old["status"])
        else:
            result.pop("status", None)
    if kind.plural == "pods":
        _check_pod_spec_change(name, old.get("spec") or {}, result.get("spec") or {})
    validate(kind, result)
    return result


def _check_pod_spec_change(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    if _pod_spec_fixed_part(old) != _pod_spec_fixed_part(new):
        raise invalid("pods", name, "spec: Forbidden: pod updates may not change fields other than "
                      "spec.containers[*].image, spec.initContainers[*].image, spec.activeDeadlineSeconds, "
                      "spec.tolerations (only additions to existing tolerations), "
                      "spec.terminationGracePeriodSeconds or spec.schedulingGates (set spec.nodeName "
                      "through a Binding)")


def _pod_spec_fixed_part(spec: dict[str, Any]) -> dict[str, Any]:
    fixed = {k: v for k, v in spec.items() if k not in _POD_MUTABLE_SPEC}
    for key in ("containers", "initContainers"):
        if isinstance(fixed.get(key), list):
            fixed[key] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                          for c in fixed[key]]
    return fixed


def bind(pod: dict[str, Any], node: str, annotations: dict[str, str], now: str) -> dict[str, Any]:
    """The pod after a Binding to `node`: `spec.nodeName`, the binding's annotations, PodScheduled."""
    result = copy.deepcopy(pod)
    result.setdefault("spec", {})["nodeName"] = node
    if annotations:
        result["metadata"].setdefault("annotations", {}).update(annotations)
    status = result.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                       "lastTransitionTime": now})
    status["conditions"] = conditions
    return result


@dataclass(frozen=True)
class ResourceKind:
    plural: str
    kind: str
    namespaced: bool
    has_status: bool
    returns_deleted_object: bool
    fields: Mapping[str, FieldGetter] = field(default_factory=dict, compare=False, hash=False)
    group: str = ""  # "" = the core group
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"
