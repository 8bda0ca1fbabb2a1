"""`gpumgr webhook` as a process: refuses to start without a usable certificate, serves HTTPS with one."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.webhook.conftest import Pair, client_context
from tests.webhook.reviews import CORE, container, patch_of, pod, review

GPUMGR = [sys.executable, "-m", "gpumgr.cli", "webhook"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMGR_")}
    env.update(extra)
    return env


def _fails(args: list[str], **env: str) -> str:
    r = subprocess.run([*GPUMGR, *args], capture_output=True, text=True, timeout=60, env=_env(**env))
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumgr webhook: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_refuses_to_start_without_certificates() -> None:
    assert "--tls-cert-file and --tls-key-file are required" in _fails(["--listen", "127.0.0.1:1"])


def test_refuses_half_a_pair_missing_files_and_bad_pem(tmp_path: Path, certs: Pair) -> None:
    assert "both" in _fails(["--tls-cert-file", str(certs.cert)])
    missing = tmp_path / "nope.key"
    assert f"--tls-key-file {missing}: no such file" in _fails(
        ["--tls-cert-file", str(certs.cert), "--tls-key-file", str(missing)])
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    assert f"cannot use --tls-cert-file {junk}" in _fails(["--tls-cert-file", str(junk), "--tls-key-file",
                                                           str(certs.key)])
    assert "--client-ca-file" in _fails([], GPUMGR_TLS_CERT_FILE=str(certs.cert), GPUMGR_TLS_KEY_FILE=str(certs.key),
                                        GPUMGR_CLIENT_CA_FILE=str(tmp_path / "ca.crt"))


def test_refuses_bad_listen_and_scheduler_name(certs: Pair) -> None:
    tls = ["--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key)]
    assert "--listen" in _fails([*tls, "--listen", "127.0.0.1:99999"])
    assert "--scheduler-name" in _fails([*tls, "--scheduler-name", "Not A Name"])
    assert "--probe-listen '127.0.0.1:0'" in _fails([*tls, "--probe-listen", "127.0.0.1:0"])
    assert "--probe-listen" in _fails([*tls, "--probe-listen", "nowhere"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_alive(proc: subprocess.Popen[str], base: str, ctx: ssl.SSLContext | None = None) -> None:
    """Until `base`/healthz answers alive (30 s at most, the process still running)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{base}/healthz", context=ctx, timeout=5) as r:
                assert json.load(r) == {"status": "alive"}
            return
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.1)


def test_serves_https_with_flags_from_the_environment(certs: Pair) -> None:
    port = _free_port()
    proc = subprocess.Popen(GPUMGR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(GPUMGR_LISTEN=f"127.0.0.1:{port}", GPUMGR_TLS_CERT_FILE=str(certs.cert),
                                     GPUMGR_TLS_KEY_FILE=str(certs.key), GPUMGR_SCHEDULER_NAME="gpu-sched"))
    ctx = client_context(certs.cert)
    try:
        _wait_alive(proc, f"https://127.0.0.1:{port}", ctx)
        body = json.dumps(review(pod(container("t", limits={CORE: "100"})))).encode()
        req = urllib.request.Request(f"https://127.0.0.1:{port}/mutate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            resp = json.load(r)["response"]
        assert patch_of(resp)[0]["value"] == "gpu-sched"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "schedulerName set to gpu-sched" in err and "Traceback" not in err


def test_insecure_http_serves_plain_http_with_a_warning() -> None:
    port = _free_port()
    proc = subprocess.Popen([*GPUMGR, "--insecure-http", "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_alive(proc, f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "WARNING" in err and "--insecure-http" in err


def test_probe_listen_serves_healthz_over_http_while_mutate_needs_a_client_certificate(tmp_path: Path,
                                                                                     certs: Pair) -> None:
    from tests.webhook.conftest import make_cert

    ca = make_cert(tmp_path, "ca", cn="webhook-callers")
    port, probe = _free_port(), _free_port()
    proc = subprocess.Popen([*GPUMGR, "--listen", f"127.0.0.1:{port}", "--tls-cert-file", str(certs.cert),
                             "--tls-key-file", str(certs.key), "--client-ca-file", str(ca.cert)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(GPUMGR_PROBE_LISTEN=f"127.0.0.1:{probe}"))
    try:
        _wait_alive(proc, f"http://127.0.0.1:{probe}")
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=client_context(certs.cert), timeout=5)
            raise AssertionError("served a caller without a client certificate")
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"health probe on http://127.0.0.1:{probe}/healthz" in err and "client certificates required" in err


def test_refuses_bad_limits(certs: Pair) -> None:
    tls = ["--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key)]
    for flag, value in (("--max-cards-per-container", "0"), ("--max-cards-per-container", "1.5"),
                        ("--header-timeout", "-1"), ("--header-timeout", "nan"), ("--max-connections", "lots")):
        assert flag in _fails([*tls, flag, value]), (flag, value)


def test_max_cards_per_container_is_applied() -> None:
    port = _free_port()
    proc = subprocess.Popen([*GPUMGR, "--insecure-http", "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(GPUMGR_MAX_CARDS_PER_CONTAINER="2"))
    try:
        deadline = time.monotonic() + 30
        body = json.dumps(review(pod(container("t", limits={CORE: "300"})))).encode()
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/mutate", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    resp = json.load(r)["response"]
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
                time.sleep(0.1)
        assert resp["allowed"] is False and "at most 2 whole cards" in resp["status"]["message"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
