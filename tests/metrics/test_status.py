"""`gpumgr status` as a user runs it (a real subprocess) against a running agent's HTTP endpoints."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import pytest
from aiohttp import web

from tests.metrics.node import GIB, SimNode
from tests.metrics.scrape import serving


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
