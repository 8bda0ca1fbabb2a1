"""The node whose checkpoint tests/fixtures/checkpoint-v1/ holds, written by gpumgr's format version 1 (allocation
labels as a map of strings): the same pods, with the same UIDs, so that an agent started on that file finds every
holder alive. Pod UIDs come from a counter instead of uuid4 (`fixed_uids`).

The file was written by gpumgr 1 itself (commit b18b538, in a `git archive` copy): `run` on a sim node, then the
claim of `claim_grant` through that version's `ClaimPreparer.allocations` and `NodeState.commit`, then the agent
stopped and its checkpoint file copied here."""

from __future__ import annotations

import asyncio
import contextlib
import types
import uuid
from collections.abc import Iterator
from typing import Any

from gpumgr.sim.kubelet import AdmittedPod
from gpumgr.sim.node import SimNode

FIXTURE = "checkpoint-v1"
CLAIM_UID = "0c1a1f00-0000-4000-8000-00000000c1a1"


@contextlib.contextmanager
def fixed_uids() -> Iterator[None]:
    """The API server names objects 00000000-0000-4000-8000-<n>, in creation order."""
    from gpumgr.sim.kubeapi import store

    counter = iter(range(1, 1 << 30))
    real = store.uuid
    store.uuid = types.SimpleNamespace(uuid4=lambda: uuid.UUID(f"00000000-0000-4000-8000-{next(counter):012d}"))  # type: ignore[assignment]
    try:
        yield
    finally:
        store.uuid = real  # type: ignore[assignment]


async def run(node: SimNode) -> tuple[dict[str, Any], AdmittedPod]:
    """Whole card, a verified share, an init container whose devices its app container reuses (one rides on the
    other), a pod of two GPU containers, whole cards admitted for a pod not bound here (nobody to name: a nameless
    allocation), and a pod admitted but not started while a second one could have been it (an unverified guess)."""
    await node.run_pod("whole", [("main", 100, 0)])
    await node.run_pod("frac", [("main", 30, 8)])
    await node.run_pod("reuse", [("main", 30, 8)], init_containers=[("setup", 20, 4)])
    await node.run_pod("two", [("first", 20, 4), ("second", 25, 6)])
    await node.admit(node.create_pod("elsewhere", [("main", 100, 0)], bind=False), start=False)
    maybe_a = node.create_pod("maybe-a", [("main", 40, 4)])
    node.create_pod("maybe-b", [("main", 40, 12)])
    await asyncio.sleep(0)
    return maybe_a, await node.admit(maybe_a, start=False)


def claim_grant() -> Any:
    """The DRA claim of the fixture: one claim granted two shares (cards 6 and 7), as gpumgr 1's preparer got it."""
    pod = types.SimpleNamespace(name="dra-infer", uid="00000000-0000-4000-8000-0000000dca1f")
    devices = [types.SimpleNamespace(index=i, cores=30, memory_mib=4096, device=f"gpu-{i}-share", request=r,
                                     share_id=f"s{n + 1}") for n, (i, r) in enumerate([(7, "gpu"), (6, "extra")])]
    return types.SimpleNamespace(uid=CLAIM_UID, namespace="default", name="infer-gpu", pods=[pod], devices=devices)
