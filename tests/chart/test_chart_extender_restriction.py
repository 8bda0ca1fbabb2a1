"""The extender's ValidatingAdmissionPolicy: on pods, only gpumgr's annotations and (on its own replicas' pods)
the leader label; evaluated with cel-python the way the API server binds the request."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .cel_support import admission_request, run_policy
from .support import NAMESPACE, PREFIX, render

EXTENDER_USER = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-extender"
LEADER = "gpumgr.io/extender-leader"


def policy() -> dict[str, Any]:
    return render({}).get("ValidatingAdmissionPolicy", f"{PREFIX}-extender-restriction")


def pod(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": namespace, "labels": {"app": "x"}, "annotations": {"team": "a"}},
            "spec": {"containers": [{"name": "c", "image": "cuda:12"}]}}


def verdict(old: dict[str, Any], new: dict[str, Any], user: str = EXTENDER_USER) -> Any:
    request = admission_request(user, "UPDATE", "pods")
    request["namespace"] = old["metadata"]["namespace"]
    return run_policy(policy(), request, new, old)


def with_(obj: dict[str, Any], section: str, key: str, value: str | None) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    if value is None:
        new["metadata"][section].pop(key)
    else:
        new["metadata"][section][key] = value
    return new


def test_extender_may_write_its_annotations() -> None:
    old = pod("ml")
    assert verdict(old, with_(old, "annotations", "tencent.com/predicate-gpu-idx-0", "1")).denied == []


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("annotations", "team", "b", "annotations under"),
        ("annotations", "team", None, "annotations under"),
        ("labels", "app", "y", "label gpumgr.io/extender-leader"),
        ("labels", LEADER, "true", "label gpumgr.io/extender-leader"),  # not in the release's namespace
    ],
)
def test_extender_may_not_touch_the_rest_of_a_pod(section: str, key: str, value: str | None, message: str) -> None:
    old = pod("ml")
    denied = verdict(old, with_(old, section, key, value)).denied
    assert len(denied) == 1 and message in denied[0], denied


def test_leader_label_only_in_the_release_namespace_and_never_the_spec() -> None:
    old = pod(NAMESPACE)
    assert verdict(old, with_(old, "labels", LEADER, "true")).denied == []
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "evil"
    assert verdict(old, new).denied == ["the gpumgr extender may not change the spec of a pod"]


def test_other_users_are_not_concerned() -> None:
    old = pod("ml")
    assert not verdict(old, with_(old, "labels", "app", "y"), user="alice").matched
