"""`coordination.k8s.io/v1` Leases on the Kubernetes API test server, driven by the real `kubernetes` client."""

from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpumgr.sim.kubeapi import ThreadedKubeApiServer

NS = "gpu-system"


@pytest.fixture
def api() -> Iterator[ThreadedKubeApiServer]:
    server = ThreadedKubeApiServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def leases(api: ThreadedKubeApiServer, tmp_path: Path) -> client.CoordinationV1Api:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return client.CoordinationV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def lease(holder: str, duration: int = 15, transitions: int = 0) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "gpumgr-extender"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": now,
                     "renewTime": now, "leaseTransitions": transitions}}


def raw(api: ThreadedKubeApiServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(api.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_create_read_replace_patch(leases: client.CoordinationV1Api) -> None:
    created = leases.create_namespaced_lease(NS, lease("a"))
    assert created.metadata.namespace == NS and created.metadata.resource_version
    assert created.spec.holder_identity == "a" and created.spec.lease_duration_seconds == 15
    assert created.spec.renew_time.tzinfo is not None  # a MicroTime the client parses
    read = leases.read_namespaced_lease("gpumgr-extender", NS)
    read.spec.holder_identity = "b"
    read.spec.lease_transitions = 1
    replaced = leases.replace_namespaced_lease("gpumgr-extender", NS, read)
    assert replaced.spec.holder_identity == "b" and replaced.spec.lease_transitions == 1
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    patched = leases.patch_namespaced_lease("gpumgr-extender", NS, {"spec": {"holderIdentity": ""}})
    assert patched.spec.holder_identity in ("", None) and patched.spec.lease_transitions == 1
    assert [x.metadata.name for x in leases.list_namespaced_lease(NS).items] == ["gpumgr-extender"]


def test_a_stale_replace_is_a_conflict_and_changes_nothing(leases: client.CoordinationV1Api) -> None:
    leases.create_namespaced_lease(NS, lease("a"))
    first = leases.read_namespaced_lease("gpumgr-extender", NS)
    second = leases.read_namespaced_lease("gpumgr-extender", NS)
    first.spec.holder_identity = "one"
    leases.replace_namespaced_lease("gpumgr-extender", NS, first)
    second.spec.holder_identity = "two"  # read before the first replace: its resourceVersion is stale
    with pytest.raises(ApiException) as e:
        leases.replace_namespaced_lease("gpumgr-extender", NS, second)
    assert e.value.status == 409
    assert json.loads(e.value.body)["reason"] == "Conflict"
    assert leases.read_namespaced_lease("gpumgr-extender", NS).spec.holder_identity == "one"
    stale_patch = {"metadata": {"resourceVersion": second.metadata.resource_version}, "spec": {"holderIdentity": "x"}}
    with pytest.raises(ApiException) as e:
        leases.patch_namespaced_lease("gpumgr-extender", NS, stale_patch)
    assert e.value.status == 409


def test_a_second_create_is_already_exists(leases: client.CoordinationV1Api) -> None:
    leases.create_namespaced_lease(NS, lease("a"))
    with pytest.raises(ApiException) as e:
        leases.create_namespaced_lease(NS, lease("b"))
    assert e.value.status == 409 and json.loads(e.value.body)["reason"] == "AlreadyExists"
    assert leases.read_namespaced_lease("gpumgr-extender", NS).spec.holder_identity == "a"


def test_missing_lease_is_not_found(leases: client.CoordinationV1Api) -> None:
    with pytest.raises(ApiException) as e:
        leases.read_namespaced_lease("nobody", NS)
    assert e.value.status == 404


def test_bad_lease_fields_are_refused(api: ThreadedKubeApiServer) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    for spec, code in (({"leaseDurationSeconds": "15"}, 400), ({"leaseDurationSeconds": 0}, 422),
                       ({"leaseTransitions": -1}, 422), ({"renewTime": "yesterday"}, 400),
                       ({"holderIdentity": 7}, 400)):
        status, doc = raw(api, "POST", path, {"metadata": {"name": "l"}, "spec": spec})
        assert status == code, (spec, doc)
    assert raw(api, "GET", f"{path}/l")[0] == 404
    assert raw(api, "GET", "/apis/coordination.k8s.io/v1/leases")[0] == 200  # across namespaces
    assert raw(api, "GET", "/api/v1/namespaces/default/leases")[0] == 404  # not a core resource


def test_discovery_lists_the_coordination_group(leases: client.CoordinationV1Api) -> None:
    resources = {r.name: r for r in leases.get_api_resources().resources}
    assert resources["leases"].namespaced and {"create", "get", "update", "patch"} <= set(resources["leases"].verbs)
    groups = {g.name for g in client.ApisApi(leases.api_client).get_api_versions().groups}
    assert {"coordination.k8s.io", "resource.k8s.io"} <= groups
    group = client.CoordinationApi(leases.api_client).get_api_group()
    assert group.preferred_version.group_version == "coordination.k8s.io/v1"

