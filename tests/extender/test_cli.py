"""`gpumgr extender` as a process: flags and environment, serving, stopping on SIGTERM, refusing bad flags."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from gpumgr.sim.kubeapi import KubeApiServer
from tests.extender.support import args, eventually, inventory, node, pod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpumgr(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpumgr.cli", "extender", *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


async def test_serves_from_flags_and_environment_and_stops_on_sigterm(api: KubeApiServer, tmp_path: Path) -> None:
    api.store.create_node(node("n", inventory(1)))
    p = api.store.create_pod(pod("p", [(100, 0)]))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    port = free_port()
    proc = gpumgr("--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig),
                  env={"GPUMGR_URL_PREFIX": "/sched/", "GPUMGR_POLICY": "spread",
                       "GPUMGR_INSECURE_SERVE_WITHOUT_AUTH": "1"})
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:

            async def ready() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            assert await eventually(ready, timeout=30, interval=0.1), proc.stderr
            async with http.post(f"http://127.0.0.1:{port}/sched/filter", json=args(p, ["n"])) as r:
                assert r.status == 200
                assert (await r.json())["NodeNames"] == ["n"]
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.get_running_loop().run_in_executor(None, lambda: proc.wait(timeout=20))
        assert code == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_bad_flags_are_refused_with_a_message(tmp_path: Path) -> None:
    cases = [
        (["--listen", "nowhere"], {}, "--listen 'nowhere'"),
        (["--listen", "127.0.0.1:70000"], {}, "port from 1 to 65535"),
        (["--policy", "random"], {}, "--policy 'random'"),
        ([], {"GPUMGR_POLICY": "fifo"}, "--policy 'fifo'"),
        (["--kubeconfig", str(tmp_path / "missing")], {}, "no such file"),
        (["--url-prefix", "/a b"], {}, "plain URL path"),
    ]
    for argv, env, words in cases:
        proc = gpumgr(*argv, env=env)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, (argv, err)
        assert words in err, (argv, err)
