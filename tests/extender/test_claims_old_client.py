"""With a `kubernetes` client of 30..33 (no `ResourceV1Api`), the extender lists and watches ResourceClaims through
the client's generic `call_api`; it must get the same pages, continue tokens and watch events as the typed API of
newer clients. The older client is stood in for by the installed one without `ResourceV1Api`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from gpumgr.extender.kubeaccess import KubeAccess
from gpumgr.sim.kubeapi import ThreadedKubeApiServer


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io"}}]}}}


def pages(access: KubeAccess) -> tuple[list[list[str]], str]:
    out, cont, rv = [], None, ""
    while True:
        page = access.list_page("resourceclaims", 2, cont)
        out.append([c["metadata"]["name"] for c in page["items"]])
        rv = page["metadata"]["resourceVersion"]
        cont = page["metadata"].get("continue")
        if not cont:
            return out, rv


def first_events(access: KubeAccess, rv: str, n: int) -> list[tuple[str, str]]:
    resp = access.open_watch("resourceclaims", rv, 5)
    got: list[tuple[str, str]] = []
    try:
        for line in resp.stream(amt=None, decode_content=True):
            for raw in line.splitlines():
                ev = json.loads(raw)
                if ev["type"] != "BOOKMARK":
                    got.append((ev["type"], ev["object"]["metadata"]["name"]))
            if len(got) >= n:
                return got
    finally:
        resp.release_conn()
    return got


@pytest.mark.parametrize("typed", [True, False], ids=["ResourceV1Api", "call_api (kubernetes 30-33)"])
def test_claims_are_listed_in_pages_and_watched_with_either_client(tmp_path: Path, typed: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if not typed:
        monkeypatch.setattr(kubernetes.client, "ResourceV1Api", None, raising=False)  # its names load lazily
    with ThreadedKubeApiServer() as api:
        for i in range(5):
            api.store.create_object("resourceclaims", claim(f"c{i}"), "ns")
        access = KubeAccess(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            listed, rv = pages(access)
            assert listed == [["c0", "c1"], ["c2", "c3"], ["c4"]]
            api.store.create_object("resourceclaims", claim("late"), "ns")
            assert first_events(access, rv, 1) == [("ADDED", "late")]
        finally:
            access.close()
