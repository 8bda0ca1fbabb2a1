"""Hostile callers (issue 9, items 2-5), each reproduced over a real socket with small, fast sizes: bodies over
the limit, gzip bombs, node names the extender has never seen, a pod with 100k containers, slow headers and
bodies, aborted uploads, too many connections and too many bodies at once."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import socket
import zlib
from typing import Any

import pytest

from gpumgr.serving.body import Limits
from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, eventually, inventory, node, pod

KIB = 1024


async def seeded(api: KubeApiServer, start_extender: Any, **limits: Any) -> tuple[Any, dict[str, Any], int]:
    api.store.create_node(node("n", inventory(2)))
    p = api.store.create_pod(pod("p", [(30, 8)]))
    ext = await start_extender(limits=Limits(**limits))
    return ext, p, int(ext.root.rsplit(":", 1)[1])


async def exchange(port: int, head: bytes, body: bytes = b"", then_wait: float = 10.0) -> bytes:
    """Send raw bytes, then read until the server closes (or `then_wait` seconds pass: b"TIMEOUT" appended)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        out = b""
        try:
            async with asyncio.timeout(then_wait):
                while chunk := await reader.read(65536):
                    out += chunk
        except TimeoutError:
            return out + b"TIMEOUT"
        return out
    finally:
        writer.close()


def request(path: str, length: int | None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{size}{extra}\r\n").encode()


def status_and_doc(raw: bytes) -> tuple[int, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def test_a_body_over_the_limit_is_refused_before_it_is_read(api: KubeApiServer, start_extender: Any) -> None:
    ext, p, port = await seeded(api, start_extender, max_body_bytes=64 * KIB)

    # announced: answered from the headers alone, the body is never sent
    raw = await exchange(port, request("/gpumgr/filter", 64 * KIB + 1))
    status, doc = status_and_doc(raw)
    assert status == 413 and "larger than the limit of 65536 bytes" in doc["Error"], raw[:300]

    # chunked, no length: refused once the bytes read pass the limit
    big = json.dumps({"Pod": p, "NodeNames": ["n"] * 20_000}).encode()
    assert len(big) > 64 * KIB
    async with ext.http.post(f"{ext.url}/filter", data=_chunks(big)) as r:
        assert r.status == 413 and "larger than the limit" in (await r.json())["Error"]
    assert (await ext.filter(args(p, ["n"])))["NodeNames"] == ["n"]  # and the extender still serves


async def _chunks(data: bytes) -> Any:
    for i in range(0, len(data), 16 * KIB):
        yield data[i:i + 16 * KIB]


async def test_a_gzip_bomb_is_refused_without_being_expanded(api: KubeApiServer, start_extender: Any) -> None:
    ext, p, port = await seeded(api, start_extender)
    bomb = gzip.compress(b"[" + b" " * (200 * 1024 * KIB) + b"]", compresslevel=9)  # 200 MiB of JSON in ~200 KiB
    assert len(bomb) < 1024 * KIB

    for encoding, body in (("gzip", bomb), ("deflate", zlib.compress(b" " * (50 * 1024 * KIB)))):
        async with ext.http.post(f"{ext.url}/filter", data=body, headers={
                "Content-Encoding": encoding, "Content-Type": "application/json"}) as r:
            doc = await r.json()
            assert r.status == 413 and "expands beyond the limit" in doc["Error"], (encoding, doc)

    good = gzip.compress(json.dumps(args(p, ["n"])).encode())
    async with ext.http.post(f"{ext.url}/filter", data=good, headers={"Content-Encoding": "gzip"}) as r:
        assert r.status == 200 and (await r.json())["NodeNames"] == ["n"]
    async with ext.http.post(f"{ext.url}/filter", data=good[:-20], headers={"Content-Encoding": "gzip"}) as r:
        assert r.status == 400 and "truncated" in (await r.json())["Error"]
    async with ext.http.post(f"{ext.url}/filter", data=b"{}", headers={"Content-Encoding": "br"}) as r:
        assert r.status == 415 and "Content-Encoding" in (await r.json())["Error"]


async def test_unknown_node_names_are_not_cached(api: KubeApiServer, start_extender: Any) -> None:
    ext, p, _ = await seeded(api, start_extender)
    await ext.filter(args(p, ["n"]))
    await ext.prioritize(args(p, ["n"]))
    before = ext.server.view.cached_entries()
    assert before > 0

    for rnd in range(2):
        names = [f"ghost-{rnd}-{i}" for i in range(1000)] + ["n"]  # unknown names a call may carry: answered
        doc = await ext.filter(args(p, names))
        assert doc["NodeNames"] == ["n"] and len(doc["FailedNodes"]) == 1000
        assert "not known" in doc["FailedNodes"][names[0]]
        await ext.prioritize(args(p, names))
        names = [f"ghost-{rnd}-{i}" for i in range(20_000)]  # more: refused before any verdict
        for verb in ("filter", "prioritize"):
            status, doc = await ext.post(verb, args(p, names))
            assert status == 400 and "20000 of the 20000 node names are not nodes of this cluster" in doc["Error"]

    assert ext.server.view.cached_entries() == before


async def test_a_pod_with_100k_containers_is_refused_and_others_are_served(api: KubeApiServer,
                                                                           start_extender: Any) -> None:
    ext, p, _ = await seeded(api, start_extender)
    monster = dict(p, spec={"containers": [{}] * 100_000})

    async def health() -> int:
        async with ext.http.get(f"{ext.root}/healthz") as r:
            return r.status

    (status, doc), ok, normal = await asyncio.gather(ext.post("filter", args(monster, ["n"])), health(),
                                                    ext.filter(args(p, ["n"])))

    # refused from a count of the raw bytes, before it is decoded
    assert status == 400 and "objects and arrays; at most 43690 are accepted" in doc["Error"], doc
    assert ok == 200 and normal["NodeNames"] == ["n"]
    status, doc = await ext.post("filter", args(dict(p, spec={"containers": [{}] * 1000}), ["n"]))
    assert status == 400 and "Pod.spec.containers has 1000 entries; at most 256" in doc["Error"], doc
    status, doc = await ext.post("filter", args(dict(p, spec={"initContainers": [{}] * 257}), ["n"]))
    assert status == 400 and "Pod.spec.initContainers has 257 entries" in doc["Error"], doc


async def test_the_view_keeps_only_what_the_extender_reads(api: KubeApiServer, start_extender: Any) -> None:
    api.store.create_node(node("n", inventory(1)))
    big = pod("big", [(30, 8)], annotations={"notes": "x" * 100_000, "gpumgr.io/gpu-model": "A100"})
    big["spec"]["containers"][0]["env"] = [{"name": f"E{i}", "value": "v" * 100} for i in range(500)]
    created = api.store.create_pod(big)
    ext = await start_extender()

    kept = ext.server.view.pod("default", "big")
    assert kept is not None and len(json.dumps(kept)) < 1000, kept
    assert kept["metadata"]["annotations"] == {"gpumgr.io/gpu-model": "A100"}
    assert kept["metadata"]["uid"] == created["metadata"]["uid"]
    assert await ext.bind(created, "n") == ""  # and bind, which reads the view's copy, works
    after = api.store.get_pod("default", "big")
    assert after is not None and after["metadata"]["annotations"]["notes"] == "x" * 100_000


async def test_slow_headers_are_cut_off(api: KubeApiServer, start_extender: Any) -> None:
    _ext, _p, port = await seeded(api, start_extender, header_timeout=0.3)

    raw = await exchange(port, b"POST /gpumgr/filter HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and nothing more

    assert not raw.endswith(b"TIMEOUT"), "the connection was not closed"


async def test_a_slow_body_gets_408_and_the_connection_closed(api: KubeApiServer, start_extender: Any) -> None:
    _ext, _p, port = await seeded(api, start_extender, body_timeout=0.3)

    raw = await exchange(port, request("/gpumgr/filter", 1000), b'{"Pod": ')

    assert not raw.endswith(b"TIMEOUT"), "the connection was not closed"
    status, doc = status_and_doc(raw)
    assert status == 408 and "did not arrive within 0.3 s" in doc["Error"]


async def test_an_aborted_upload_logs_one_line_and_no_traceback(api: KubeApiServer, start_extender: Any,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    ext, p, port = await seeded(api, start_extender)
    caplog.set_level(logging.INFO)

    for _ in range(3):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("/gpumgr/filter", 100_000) + b'{"Pod": {"spec": {}}, "NodeNames": [')
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def logged() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "went away" in r.getMessage()]

    gone = await eventually(lambda: _at_least(logged, 3))
    assert len(gone) == 3, [r.getMessage() for r in caplog.records]
    assert all("/gpumgr/filter" in r.getMessage() for r in gone)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert (await ext.filter(args(p, ["n"])))["NodeNames"] == ["n"]


async def _at_least(get: Any, n: int) -> list[logging.LogRecord]:
    found = await get()
    return found if len(found) >= n else []


async def test_connections_over_the_cap_get_503(api: KubeApiServer, start_extender: Any) -> None:
    ext, p, port = await seeded(api, start_extender, max_connections=3)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        await asyncio.sleep(0.05)  # let the server register them
        raw = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, doc = status_and_doc(raw)
        assert status == 503 and "too many open connections" in doc["Error"]
    finally:
        for _r, w in held:
            w.close()

    async def served() -> bool:
        raw = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return raw.startswith(b"HTTP/1.1 200")

    assert await eventually(served)


async def test_too_many_bodies_at_once_get_503(api: KubeApiServer, start_extender: Any) -> None:
    ext, p, port = await seeded(api, start_extender, max_body_bytes=4 * KIB, max_connections=64, body_timeout=5)
    writers = []
    try:
        for _ in range(16):  # the budget: 16 bodies of the largest size, all stalled half-way
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(request("/gpumgr/filter", 4 * KIB) + b"{")
            await w.drain()
            writers.append(w)
        await asyncio.sleep(0.1)
        raw = await exchange(port, request("/gpumgr/filter", 4 * KIB), b"{" + b" " * (4 * KIB - 2) + b"}")
        status, doc = status_and_doc(raw)
        assert status == 503 and "too many request bodies" in doc["Error"]
    finally:
        for w in writers:
            w.close()

    async def served() -> bool:
        async with ext.http.post(f"{ext.url}/filter", json=args(p, ["n"])) as r:
            return r.status == 200

    assert await eventually(served)


async def test_an_answer_the_caller_does_not_read_is_dropped(api: KubeApiServer, start_extender: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # the ~13 MB body must arrive within the body timeout too: 2 s, not less, for a loaded machine
    ext, p, port = await seeded(api, start_extender, body_timeout=2, max_body_bytes=16 * 1024 * KIB)
    caplog.set_level(logging.INFO)
    item = {"metadata": {"name": "n"}, "status": {"pad": "x" * 9000}}
    body = json.dumps({"Pod": p, "Nodes": {"items": [item] * 1500}, "NodeNames": None}).encode()  # ~13 MB echoed
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(request("/gpumgr/filter", len(body)) + body)
        await writer.drain()

        async def dropped() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "was not taken within 2 s" in r.getMessage()]

        assert await eventually(dropped, timeout=10), [r.getMessage() for r in caplog.records]
        got = b""
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                got += chunk
        assert len(got) < len(body)  # the answer was cut off, not kept until the caller wanted it
    finally:
        writer.close()
    assert (await ext.filter(args(p, ["n"])))["NodeNames"] == ["n"]
