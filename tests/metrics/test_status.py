"""`gpumgr status` as a user runs it (a real subprocess) against a running agent's HTTP endpoints."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import pytest
from aiohttp import web

from tests.metrics.node import GIB, SimNode
from tests.metrics.scrape import get, serving


async def gpumgr(*args: str) -> tuple[int, str, str]:
    p = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpumgr.cli", *args,
                                             stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(p.communicate(), 60)
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


@pytest.fixture
def node(tmp_path):
    return SimNode(tmp_path)


def row(text: str, first: str) -> list[str]:
    """The cells (split on 2+ spaces) of the table row starting with `first`."""
    import re

    lines = [ln for ln in text.splitlines() if ln.strip().startswith(first)]
    assert len(lines) == 1, (first, lines)
    return re.split(r"\s{2,}", lines[0].strip())


async def test_status_prints_cards_holders_and_tree(node):
    await node.place("train", "main", (0,), cores=30, memory_mib=4096, pids=[101])
    await node.place("big", "worker", (2, 3), cores=200, memory_mib=0, pids=[300], verified=False,
                     namespace="batch")
    node.sim.set_process(0, 101, used_memory_bytes=GIB, sm_util=20)
    await node.state.set_reason(1, "ecc", True)
    async with serving(node) as server:
        code, out, err = await gpumgr("status", "--addr", server.url)
        jcode, jout, _ = await gpumgr("status", "--addr", server.url.removeprefix("http://"), "--format", "json")
    assert code == 0, err

    assert row(out, "Node") == ["Node node-a"]
    gpu0 = row(out, "0  ")
    assert gpu0[2:9] == ["ok", "shared", "30/100", "4096/16384 MiB", "1024 MiB", "20%", "40 C"]
    assert row(out, "1  ")[2] == "UNHEALTHY ecc"
    assert row(out, "3  ")[3:5] == ["exclusive", "100/100"]
    assert row(out, "ml ")[:10] == ["ml", "train", "main", "0", "30", "4096 MiB", "yes", "1", "1024 MiB", "20%"]
    assert row(out, "batch")[:7] == ["batch", "big", "worker", "2,3", "200", "32768 MiB", "no"]
    assert row(out, "ROOT") == ["ROOT", "0,1,2,3", "0/4", "70", "12288 MiB"]

    assert jcode == 0
    doc = json.loads(jout)
    assert {h["pod"] for h in doc["usage"]["holders"]} == {"train", "big"}
    assert doc["graph"]["tree"]["level"] == "ROOT"


async def test_status_when_the_agent_is_not_there():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        code, out, err = await gpumgr("status", "--addr", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the agent at" in lines[0] and str(port) in lines[0], err
    assert "Traceback" not in err


async def test_status_when_something_else_answers():
    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>")

    app = web.Application()
    app.router.add_get("/usage", html)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        code, _, err = await gpumgr("status", "--addr", f"127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert code == 1 and len(err.strip().splitlines()) == 1 and "did not answer JSON" in err


async def test_status_bad_address():
    code, _, err = await gpumgr("status", "--addr", "ftp://somewhere")
    assert code == 2 and "expected http://host:port" in err and "Traceback" not in err


async def test_status_against_a_peer_that_does_not_speak_http():
    async def silent_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(silent_garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code, _, err = await gpumgr("status", "--addr", f"127.0.0.1:{port}", "--timeout", "5")
    finally:
        server.close()
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def holder_rows(text: str) -> list[list[str]]:
    import re

    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("NAMESPACE"))
    out = []
    for ln in lines[start + 1:]:
        if not ln.strip() or ln.startswith("PIDS -:"):
            break
        out.append(re.split(r"\s{2,}", ln.strip()))
    return out


async def test_status_sorts_holders_by_card_then_pod_and_shows_no_process_as_dash(node):
    await node.place("zeta", "main", (3,), cores=100, memory_mib=0, pids=[300])
    await node.place("beta", "main", (0,), cores=30, memory_mib=1024, pids=[], running=False)
    await node.place("alpha", "side", (0,), cores=20, memory_mib=1024, pids=[101])
    await node.place("alpha", "main", (0,), cores=20, memory_mib=1024, pids=[100])
    await node.place("gamma", "main", (1, 2), cores=200, memory_mib=0, pids=[200])
    async with serving(node) as server:
        code, out, err = await gpumgr("status", "--addr", server.url)
    assert code == 0, err
    rows = holder_rows(out)
    assert [(r[1], r[2]) for r in rows] == [("alpha", "main"), ("alpha", "side"), ("beta", "main"),
                                           ("gamma", "main"), ("zeta", "main")]
    beta = rows[2]
    assert beta[6] == "yes" and beta[7] == "-", beta  # verified, and no process yet: not "0 (not started?)"
    assert rows[0][7] == "1"
    assert "PIDS -: no process found yet" in out
    assert "not started?" not in out.split("NAMESPACE")[1].split("\n\n")[0]


async def test_status_shows_cordoned_cards_and_a_cordon_it_cannot_read(node):
    from contextlib import AsyncExitStack

    from gpumgr.metrics import UsageReader, build_app, start_http
    from gpumgr.node.cgroups import CgroupReader
    from gpumgr.requests.choices import ANN_CORDON, CordonWatch

    await node.place("old", "main", (2,), cores=30, memory_mib=1024, pids=[101])
    watch = CordonWatch(node.inv.gpus)
    reader = UsageReader(node.state, node.backend, node.pods.get, CgroupReader(node.cgroup_root), cordon=watch)
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(_served(build_app(node.metrics, reader), start_http))
        watch.update({"metadata": {"annotations": {ANN_CORDON: node.inv.gpus[2].uuid}}})
        code, out, err = await gpumgr("status", "--addr", server.url)
        assert code == 0, err
        assert [row(out, f"{i}  ")[-1] for i in range(4)] == ["no", "no", "yes", "no"]
        assert [(r[1], r[3]) for r in holder_rows(out)] == [("old", "2")]  # its holder stays
        assert "takes no new pods" in out and "holders keep running" in out
        assert row(out, "GPU2")[0] == "GPU2 (cordoned)" and row(out, "GPU1")[0] == "GPU1"  # the tree too
        _, _, text = await get(server.url + "/graph?format=text")
        assert "GPU2 " in text and [ln for ln in text.splitlines() if "CORDONED" in ln] == [
            ln for ln in text.splitlines() if "GPU2 " in ln]
        watch.update({"metadata": {"annotations": {ANN_CORDON: "GPU-typo"}}})
        code, out, err = await gpumgr("status", "--addr", server.url)
        assert code == 0, err
        assert [row(out, f"{i}  ")[-1] for i in range(4)] == ["yes"] * 4
        assert "is not understood" in out and "'GPU-typo'" in out
        _, jout, _ = await gpumgr("status", "--addr", server.url, "--format", "json")
        doc = json.loads(jout)
        assert [c["cordoned"] for c in doc["usage"]["cards"]] == [True] * 4 and doc["usage"]["cordon_error"]


async def test_status_without_cordon_following_shows_a_dash(node):
    async with serving(node) as server:
        code, out, err = await gpumgr("status", "--addr", server.url)
    assert code == 0, err
    assert row(out, "GPU  MODEL")[-1] == "CORDONED" and row(out, "0  ")[-1] == "-" and "takes no new pods" not in out


def _served(app, start):
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def cm():
        server = await start(app, "127.0.0.1", 0)
        try:
            yield server
        finally:
            await server.close()

    return cm()
