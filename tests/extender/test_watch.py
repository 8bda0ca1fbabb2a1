"""The cluster view follows the API through its watches: readiness, pods leaving, nodes changing, re-lists."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import aiohttp

from gpumgr.extender.server import ExtenderServer
from gpumgr.sim.kubeapi import KubeApiServer, KubeStore, write_kubeconfig
from tests.extender.support import args, assert_a_relist_frees_the_node, eventually, holding, inventory, node, pod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def passes(ext: Any, p: dict[str, Any], name: str) -> bool:
    return name in (await ext.filter(args(p, [name])))["NodeNames"]


async def test_ready_only_once_the_first_list_is_in(tmp_path: Path) -> None:
    port = free_port()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    server = ExtenderServer(str(kubeconfig), insecure=True)
    ext_port = await server.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{ext_port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"{base}/readyz") as r:
                assert r.status == 503
                assert set((await r.json())["waiting_for"]) == {"nodes", "pods"}
            async with http.get(f"{base}/healthz") as r:
                assert r.status == 200
            store = KubeStore()
            store.create_node(node("n", inventory(1)))
            async with KubeApiServer(store, port=port):

                async def ready() -> bool:
                    async with http.get(f"{base}/readyz") as r:
                        return r.status == 200

                assert await eventually(ready, timeout=60)
    finally:
        await server.stop()


async def test_cards_come_back_when_pods_finish_or_go(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("a", inventory(1)))
    s.create_node(node("b", inventory(1)))
    s.create_pod(holding("job", "a", [(100, 0, [0])]))
    s.create_pod(holding("svc", "b", [(100, 0, [0])]))
    p = s.create_pod(pod("p", [(100, 0)]))
    ext = await start_extender()
    assert not await passes(ext, p, "a") and not await passes(ext, p, "b")

    s.set_pod_phase("default", "job", "Succeeded")
    s.delete_pod("default", "svc")

    assert await eventually(lambda: passes(ext, p, "a"))
    assert await eventually(lambda: passes(ext, p, "b"))


async def test_node_changes_are_followed(api: KubeApiServer, start_extender: Any) -> None:
    s = api.store
    s.create_node(node("n", inventory(2)))
    p = s.create_pod(pod("p", [(200, 0)]))
    ext = await start_extender()
    assert await passes(ext, p, "n")

    s.update_node(node("n", inventory(2), unhealthy=[1]))  # the agent reports card 1 sick
    assert await eventually(lambda: _unresolvable(ext, p, "n"))

    s.create_node(node("late", inventory(2)))
    assert await eventually(lambda: passes(ext, p, "late"))
    s.delete_node("late")
    assert await eventually(lambda: _not_known(ext, p, "late"))


async def test_a_relist_after_the_history_is_gone_catches_up(tmp_path: Path) -> None:
    store = KubeStore(history_size=2)
    store.create_node(node("n", inventory(1)))
    store.create_pod(holding("hog", "n", [(100, 0, [0])]))
    p = store.create_pod(pod("p", [(100, 0)]))
    await assert_a_relist_frees_the_node(tmp_path, store, p, "hog")


async def _unresolvable(ext: Any, p: dict[str, Any], name: str) -> bool:
    return name in (await ext.filter(args(p, [name])))["FailedAndUnresolvableNodes"]


async def _not_known(ext: Any, p: dict[str, Any], name: str) -> bool:
    return "not known" in (await ext.filter(args(p, [name])))["FailedNodes"].get(name, "")
