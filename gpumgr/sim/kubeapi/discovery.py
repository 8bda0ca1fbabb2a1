"""The discovery documents a client may ask for: `/version`, `/api`, `/api/v1`, `/apis`."""

from __future__ import annotations

from typing import Any

from gpumgr.sim.kubeapi.objects import GROUPS, resource_kinds

_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def version() -> dict[str, Any]:
    return {"major": "1", "minor": "34", "gitVersion": "v1.34.0-gpumgr-sim", "gitCommit": "",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "", "compiler": "gc",
            "platform": "linux/amd64"}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def api_groups() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(name) for name in GROUPS]}


def api_group(name: str) -> dict[str, Any]:
    gv = {"groupVersion": f"{name}/v1", "version": "v1"}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [gv], "preferredVersion": gv}


def group_resources(name: str) -> dict[str, Any]:
    return _resource_list(name)


def core_resources() -> dict[str, Any]:
    body = _resource_list("")
    resources = body["resources"]
    resources.append({"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                      "verbs": ["create"]})
    resources.append({"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding",
                      "verbs": ["create"]})
    return body


def _resource_list(group: str) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for kind in resource_kinds().values():
        if kind.group != group:
            continue
        resources.append({"name": kind.plural, "singularName": kind.kind.lower(),
                          "namespaced": kind.namespaced, "kind": kind.kind, "verbs": list(_VERBS)})
        if kind.has_status:
            resources.append({"name": f"{kind.plural}/status", "singularName": "",
                              "namespaced": kind.namespaced, "kind": kind.kind,
                              "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/v1" if group else "v1",
            "resources": resources}
