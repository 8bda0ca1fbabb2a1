"""Identity and limits: registration with a real grpcio vDevice server, the
limits file, the fallback between them, and failing closed."""

from __future__ import annotations

import socket
import threading

import grpc
from harness import UUID_A, Fixture, GiB, MiB, fields
from registry import case
from vdevice_server import Reply, VDeviceTestServer


@case("identity: registration with a real grpcio vDevice server gives the limits")
def registration(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()  # no limits file: only the server knows
    reply = Reply(devices=[(UUID_A, 3, 1 * GiB)], core_limit=0, host_pid=424242)
    with VDeviceTestServer(str(c.socket), reply) as srv:
        env = c.env(node, VCUDA_LOG_LEVEL="3")
        r = c.run("vcmem", "init", env=env).ok()
        i = fields(c.run("vcmem", "info", env=env).ok().line("INFO"))
    assert r.line("cuInit") == "cuInit=0" and r.line("cuMemAlloc_v2") == "cuMemAlloc_v2=0", r.out
    assert i["cuda_total"] == i["nvml_total"] == 1 * GiB, i
    pid = int(r.line("PID").split()[1])
    assert len(srv.requests) == 2, srv.requests
    req = srv.requests[0]
    assert req.pid == pid, f"the shim sent pid {req.pid}, it is {pid}"
    assert req.container_id == "" or len(req.container_id) == 64, req.container_id
    assert not req.pod_uid and not req.container_name, "the shim must not guess its pod or container name"
    assert "vDevice server" in r.err and "host_pid=424242" in r.err, r.err


@case("identity: the server wins over the file; a refusal or a dead socket falls back to the file")
def fallback(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 512 * MiB)])
    env = c.env(node)
    with VDeviceTestServer(str(c.socket), Reply(devices=[(UUID_A, 0, 1 * GiB)])):
        assert fields(c.run("vcmem", "info", env=env).ok().line("INFO"))["cuda_total"] == 1 * GiB
    refuse = Reply(error=grpc.StatusCode.PERMISSION_DENIED, error_message="not your pod")
    with VDeviceTestServer(str(c.socket), refuse) as srv:
        r = c.run("vcmem", "info", env=c.env(node, VCUDA_LOG_LEVEL="4")).ok()
        assert fields(r.line("INFO"))["cuda_total"] == 512 * MiB
        assert srv.requests, "the shim did not call the server"
        assert "gRPC status 7: not your pod" in r.err, r.err
    # A stale socket file with nobody listening.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(c.socket))
    stale.close()
    assert fields(c.run("vcmem", "info", env=env).ok().line("INFO"))["cuda_total"] == 512 * MiB


def _serve_badly(sock: socket.socket, mode: str, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    held = []
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        if mode == "garbage":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello" + bytes(range(256)) * 4)
            conn.close()
        else:
            held.append(conn)  # accept and never answer
    for conn in held:
        conn.close()


@case("identity: a server that answers garbage or never answers falls back to the file")
def bad_servers(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    for mode in ("garbage", "silent"):
        c = fx.container(mode)
        c.write_limits([(UUID_A, 768 * MiB)])
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(c.socket))
        sock.listen(8)
        stop = threading.Event()
        t = threading.Thread(target=_serve_badly, args=(sock, mode, stop), daemon=True)
        t.start()
        try:
            r = c.run("vcmem", "info", env=c.env(node, VCUDA_LOG_LEVEL="4"), timeout=30).ok()
        finally:
            stop.set()
            t.join(5)
            sock.close()
        assert fields(r.line("INFO"))["cuda_total"] == 768 * MiB, (mode, r.out)
        assert "registration:" in r.err, r.err


@case("identity: without socket and file, CUDA is refused with one clear line")
def fail_closed(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    r = c.run("vcmem", "init", env=c.env(node))
    assert r.rc == 0, r.err
    assert r.line("cuInit") == "cuInit=800" and r.line("cuMemAlloc_v2") == "cuMemAlloc_v2=800", r.out
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{r.err}"
    assert "CUDA is refused" in lines[0] and str(c.socket) in lines[0] and str(c.limits) in lines[0], lines[0]
    silent = c.run("vcmem", "init", env=c.env(node, VCUDA_LOG_LEVEL="0"))
    assert silent.err == "" and "cuInit=800" in silent.out, silent.err


BAD_FILES = {
    "garbage": (b"\x7fELF\x02\x01\x01\x00" + bytes(range(1, 256)) * 8, ":1:"),
    "no version": (b"device_count=1\ndevice0_memory_limit=1024\n", "missing key 'version'"),
    "version 2": (b"version=2\ndevice_count=0\n", "unsupported version 2"),
    "no equals": (b"version=1\ncore_limit 30\n", ":2: expected key=value"),
    "bad number": (b"version=1\ndevice_count=1\ndevice0_memory_limit=12GB\n", ":3: bad value"),
    "negative": (b"version=1\ncore_limit=-5\ndevice_count=0\n", ":2: bad value"),
    "overflow": (b"version=1\ndevice_count=1\ndevice0_memory_limit=99999999999999999999999\n", ":3: bad value"),
    "missing limit": (b"version=1\ndevice_count=2\ndevice0_memory_limit=5\n", "device1_memory_limit"),
    "too many devices": (b"version=1\ndevice_count=99\n", ":2: bad value"),
    "nul byte": (b"version=1\ndevice_count=0\x00\n", ":2: contains a NUL byte"),
    "long line": (b"version=1\npod_uid=" + b"x" * 5000 + b"\n", ":2: line longer"),
    "empty": (b"", "missing key 'version'"),
    "huge": (b"# " + b"y" * (70 * 1024) + b"\n", "larger than"),
}


@case("identity: a malformed limits file never crashes: it fails closed naming file and line")
def malformed_files(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    for name, (content, expect) in BAD_FILES.items():
        c = fx.container(name.replace(" ", "_"))
        c.limits.write_bytes(content)
        r = c.run("vcmem", "init", env=c.env(node))
        assert r.rc == 0, f"{name}: exit {r.rc}\n{r.err}"
        assert r.line("cuInit") == "cuInit=800", f"{name}: {r.out}"
        err = r.err.strip().splitlines()
        assert len(err) == 1 and expect in err[0] and str(c.limits) in err[0], f"{name}: {r.err}"
    # Comments, blank lines, spaces, CRLF and unknown keys are fine.
    c = fx.container("good")
    c.limits.write_bytes(
        b"# comment\r\n\r\n  version = 1 \r\nfuture_key=whatever\r\ndevice_count=1\r\n"
        b"device0_uuid=" + UUID_A.encode() + b"\r\ndevice0_memory_limit=1073741824\r\ndevice0_colour=blue\r\n"
    )
    r = c.run("vcmem", "info", env=c.env(node)).ok()
    assert fields(r.line("INFO"))["cuda_total"] == 1 * GiB and r.err == "", r.out + r.err


@case("identity: VCUDA_LOG_LEVEL is honoured (4 = debug lines, 0 = silent)")
def log_level(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    loud = c.run("vcmem", "init", env=c.env(node, VCUDA_LOG_LEVEL="4")).ok()
    assert "debug:" in loud.err and "info:" in loud.err, loud.err
    quiet = c.run("vcmem", "init", env=c.env(node, VCUDA_LOG_LEVEL="0")).ok()
    assert quiet.err == "", quiet.err
