"""Builders for extender tests: nodes with the agent's inventory annotation, GPU pods, scheduler payloads."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumgr.devices.spec import inventory_from_topo_file
from gpumgr.devices.types import GPU, Inventory
from gpumgr.node import inventory as node_inventory
from gpumgr.requests import podspec

TOPO = Path(__file__).resolve().parents[1] / "fixtures" / "topo"
A100 = "NVIDIA A100-SXM4-40GB"
T4 = "Tesla T4"
_uids = itertools.count(1)


def inventory(count: int = 2, model: str = A100, memory_mib: int = 40960, minors: Sequence[int] | None = None,
              levels: Sequence[Sequence[str]] | None = None, models: Sequence[str] | None = None) -> Inventory:
    """`count` cards; all pairs PHB unless `levels` is given; minors 0.. unless given."""
    minors = list(minors) if minors is not None else list(range(count))
    names = list(models) if models is not None else [model] * count
    gpus = tuple(GPU(index=i, uuid=f"GPU-{next(_uids):08x}", minor=minors[i], name=names[i], memory_mib=memory_mib)
                 for i in range(count))
    lv = levels or [["X" if i == j else "PHB" for j in range(count)] for i in range(count)]
    return Inventory(gpus=gpus, levels=tuple(tuple(r) for r in lv))


def topo_inventory(fixture: str, memory_mib: int = 16384, model: str = A100) -> Inventory:
    return inventory_from_topo_file(TOPO / fixture, memory_mib=memory_mib, model=model)


def node(name: str, inv: Inventory | None, unhealthy: Sequence[int] = (), unit_mib: int = 256,
         annotation: str | None = None) -> dict[str, Any]:
    ann = {}
    if inv is not None:
        ann[podspec.ANN_NODE_INVENTORY] = node_inventory.encode(inv, frozenset(unhealthy), unit_mib)
    if annotation is not None:
        ann[podspec.ANN_NODE_INVENTORY] = annotation
    cores = 100 * (len(inv.gpus) if inv else 0)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": ann, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": {podspec.RESOURCE_CORE: str(cores)}, "allocatable": {podspec.RESOURCE_CORE: str(cores)}},
    }


def pod(name: str, containers: Sequence[tuple[int, int]] = ((100, 0),), namespace: str = "default",
        annotations: dict[str, str] | None = None, node: str | None = None, phase: str | None = None,
        names: Sequence[str] | None = None) -> dict[str, Any]:
    """A pod whose containers ask (vcuda-core, vcuda-memory units); (0, 0) is a container without GPU."""
    cs = []
    for i, (cores, units) in enumerate(containers):
        limits: dict[str, str] = {}
        if cores:
            limits[podspec.RESOURCE_CORE] = str(cores)
        if units:
            limits[podspec.RESOURCE_MEMORY] = str(units)
        cs.append({"name": names[i] if names else f"c{i}", "image": "cuda:12",
                   "resources": {"limits": limits, "requests": dict(limits)}})
    p: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {"containers": cs, "schedulerName": "gpumgr-scheduler"},
    }
    if node:
        p["spec"]["nodeName"] = node
    if phase:
        p["status"] = {"phase": phase}
    return p


def holding(name: str, node_name: str, containers: Sequence[tuple[int, int, Sequence[int]]],
            phase: str = "Running", bound: bool = True) -> dict[str, Any]:
    """A pod that holds cards: per container (cores, units, minors)."""
    ann = {podspec.ANN_PREDICATE_NODE: node_name, podspec.ANN_PREDICATE_TIME: "1", podspec.ANN_ASSIGNED: "true"}
    for i, (_c, _u, minors) in enumerate(containers):
        ann[f"{podspec.ANN_PREDICATE_IDX}{i}"] = ",".join(str(m) for m in minors)
    return pod(name, [(c, u) for c, u, _m in containers], annotations=ann, node=node_name if bound else None,
               phase=phase)


def args(p: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it with nodeCacheCapable: true."""
    return {"Pod": p, "Nodes": None, "NodeNames": list(nodes)}


def args_nodes(p: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs with nodeCacheCapable: false (full Node objects)."""
    return {"Pod": p, "Nodes": {"metadata": {}, "items": list(nodes)}, "NodeNames": None}


async def eventually(check: Any, timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Await `check()` until it returns a truthy value; the last value on timeout (bounded wait)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value or loop.time() >= deadline:
            return value
        await asyncio.sleep(interval)


# -- several `gpumgr extender` processes with leader election (tests/extender/test_ha.py, the HA bench) ----------
LEASE_NS = "gpu-system"
LEASE_NAME = "gpumgr-extender"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    name: str  # its POD_NAME: the Lease holder identity is "<name>_<random>"
    proc: subprocess.Popen[bytes]
    port: int
    probe_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def probe_url(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}"

    def holds(self, holder: str) -> bool:
        return holder.startswith(self.name + "_")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=20)


def replica_pod(name: str) -> dict[str, Any]:
    """The Pod object of a replica (what the downward API names): the leader labels it."""
    return pod(name, [(0, 0)], namespace=LEASE_NS)


def start_replica(name: str, kubeconfig: Path, logs: Path, *, duration: str = "3", renew: str = "2",
                  retry: str = "0.3", extra: Sequence[str] = ()) -> Replica:
    port, probe = free_port(), free_port()
    log = logs / f"{name}.log"
    argv = [sys.executable, "-m", "gpumgr.cli", "extender", "--listen", f"127.0.0.1:{port}",
            "--probe-listen", f"127.0.0.1:{probe}", "--kubeconfig", str(kubeconfig),
            "--insecure-serve-without-auth", "--leader-elect", "--leader-elect-namespace", LEASE_NS,
            "--leader-elect-lease-duration", duration, "--leader-elect-renew-deadline", renew,
            "--leader-elect-retry-period", retry, *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "POD_NAME": name, "POD_NAMESPACE": LEASE_NS})
    return Replica(name, proc, port, probe, log)


def lease_holder(store: Any) -> str:
    """The Lease's holderIdentity in the test API server's store ("" when none)."""
    lease = store.get_object("leases", LEASE_NAME, LEASE_NS)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def assert_a_relist_frees_the_node(tmp_path: Path, store: Any, p: dict[str, Any], holder: str) -> None:
    """`p` does not fit node "n" while pod `holder` holds it; the API goes away, the holder is deleted and more
    changes happen than the store's history keeps; when the API is back the extender's watch resumes, gets 410,
    lists again and forgets the holder: `p` fits. `store` is a KubeStore with a short history."""
    import aiohttp

    from gpumgr.extender.server import ExtenderServer
    from gpumgr.sim.kubeapi import KubeApiServer

    api = KubeApiServer(store, bookmark_interval=0.2)
    await api.start()
    server = ExtenderServer(str(api.write_kubeconfig(tmp_path / "kubeconfig")), insecure=True)
    port = await server.start("127.0.0.1", 0)
    try:
        await server.wait_ready(10)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

            async def fits() -> bool:
                async with http.post(f"http://127.0.0.1:{port}/gpumgr/filter", json=args(p, ["n"])) as r:
                    return "n" in ((await r.json())["NodeNames"] or [])

            assert not await fits()
            await api.stop()  # the watch breaks; meanwhile more changes than the history keeps
            store.delete_pod("default", holder)
            for i in range(5):
                store.create_pod(pod(f"filler-{i}", [(0, 0)]))
            await api.start()  # same port, same store: the watch resumes, gets 410, lists again
            assert await eventually(fits, timeout=60)
    finally:
        await server.stop()
        await api.stop()
