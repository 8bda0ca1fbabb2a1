"""One REST client used from several event loops, one after another (sync callers, `asyncio.run` per call):
each loop's session is closed on that loop, none is left for the garbage collector to warn about, and calls still
running on a loop are not cut by a call from another."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from gpumgr.kube.client import KubeClient
from tests.kube.conftest import Cluster, ClusterFactory
from tests.kube.test_ca_rotation import added, pod

T = TypeVar("T")


@pytest.fixture
def threaded_cluster() -> Iterator[Cluster]:
    """The API test server on a loop of its own in a thread, so that it outlives the loops of the test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-kubeapi", daemon=True)
    thread.start()
    factory = ClusterFactory()
    try:
        yield asyncio.run_coroutine_threadsafe(factory(), loop).result(10)
    finally:
        for runner in factory.runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def disconnected(request: web.Request) -> bool:
    """The client closed the connection this request came on (the server saw it go)."""
    return request.protocol.transport is None


def wait_disconnected(request: web.Request, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not disconnected(request):
        assert time.monotonic() < end, "the client kept the connection open"
        time.sleep(0.02)


def test_successive_loops_each_close_their_own_session(threaded_cluster: Cluster, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    c = threaded_cluster
    c.store.create_node({"metadata": {"name": "n"}})
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(kube.get_node("n")) is not None
        first = c.seen[-1]
        wait_disconnected(first)  # closed on its own loop, as that loop ended
        assert asyncio.run(kube.get_node("n")) is not None
        second = c.seen[-1]
        assert second.protocol is not first.protocol
        wait_disconnected(second)

        # a loop that still exists and is not running: a synchronous close() runs it to close its session
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(kube.get_node("n")) is not None
            third = c.seen[-1]
            assert not disconnected(third)
            kube.close()
            wait_disconnected(third)
        finally:
            loop.close()
        del kube
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning) or "nclosed" in str(w.message)]
    assert leaks == []
    assert "nclosed" not in caplog.text


def test_a_loop_closed_without_shutting_down_leaves_no_session_open(threaded_cluster: Cluster, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    c = threaded_cluster
    c.store.create_node({"metadata": {"name": "n"}})
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(kube.get_node("n")) is not None
    loop.close()  # without loop.shutdown_asyncgens(): nothing could close the session on its own loop
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(kube.get_node("n")) is not None  # the next call releases the session of the dead loop
        del kube
        gc.collect()
    # asyncio itself may still warn about the sockets its closed loop left behind ("unclosed transport"); the
    # client's session and connector are released
    assert [str(w.message) for w in caught if "Unclosed" in str(w.message)] == []
    assert "Unclosed" not in caplog.text


def test_a_call_from_another_loop_leaves_the_calls_running_on_the_first_one_alone(
        threaded_cluster: Cluster, tmp_path: Path) -> None:
    c = threaded_cluster
    c.store.create_node({"metadata": {"name": "n"}})
    kube = KubeClient.connect(str(c.kubeconfig(tmp_path / "kc")))
    first = asyncio.new_event_loop()
    thread = threading.Thread(target=first.run_forever, name="first-loop", daemon=True)
    thread.start()

    def on_first(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, first).result(10)

    try:
        _, rv = on_first(kube.list_node_pods("n"))
        idle = c.seen[-1]
        events = kube.watch_node_pods("n", rv, 30)
        c.store.create_pod(pod("a"))
        on_first(added(events, "a"))

        assert asyncio.run(kube.get_node("n")) is not None  # another loop: the client's session is replaced
        c.store.create_pod(pod("b"))
        on_first(added(events, "b"))  # the watch on the first loop goes on over the session it started with
        assert not disconnected(idle)

        on_first(events.aclose())  # nothing uses the first loop's session any more: that loop closes it
        wait_disconnected(idle)
    finally:
        on_first(first.shutdown_asyncgens())
        first.call_soon_threadsafe(first.stop)
        thread.join(10)
        first.close()
