"""Processes of a test cluster, each in its own process group, each with its log file; stopped with SIGTERM, a
deadline, then SIGKILL of the whole group, so nothing is left behind whatever failed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

STOP_DEADLINE_S = 10.0
RESTART_DELAY_S = 1.0


class Proc:
    """restart=True: started again whenever it exits (a crash, kill -9, kube-scheduler leaving when it loses its
    lease), as the kubelet restarts a pod's container; `stop()` ends that."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None, restart: bool = False):
        self.name = name
        self.restart = restart
        self._lock = threading.Lock()
        self._stopping = False
        self._watcher: threading.Thread | None = None
        self.args = args
        self.env = env
        self.cwd = cwd
        self.log_dir = log_dir
        self.generation = 0
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.generation}.log"

    def start(self) -> Proc:
        with self._lock:
            self._stopping = False
            self._spawn()
        if self.restart and (self._watcher is None or not self._watcher.is_alive()):
            self._watcher = threading.Thread(target=self._keep_running, name=f"restart-{self.name}", daemon=True)
            self._watcher.start()
        return self

    def _spawn(self) -> None:
        self.generation += 1
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.env, cwd=self.cwd, start_new_session=True)

    def _keep_running(self) -> None:
        while True:
            popen = self.popen
            if popen is not None:
                popen.wait()
            time.sleep(RESTART_DELAY_S)
            with self._lock:
                if self._stopping:
                    return
                if self.popen is popen:
                    self._spawn()

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group at once (as a crash would)."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=STOP_DEADLINE_S)

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> None:
        with self._lock:
            self._stopping = True
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=deadline_s)
        # whatever it left in its group (children of a shell, nsenter's target) goes too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=deadline_s)

    def logs(self, generation: int | None = None) -> str:
        gens = [generation] if generation else range(1, self.generation + 1)
        return "\n".join((self.log_dir / f"{self.name}.{g}.log").read_text(errors="replace") for g in gens
                         if (self.log_dir / f"{self.name}.{g}.log").exists())

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.logs().splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 60.0, interval_s: float = 0.25,
              procs: tuple[Proc, ...] = ()) -> object:
    """Poll `check` until it returns a true value; fail naming `what` (and the tail of any process that died)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        for proc in procs:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        try:
            value = check()
            if value:
                return value
        except Exception as error:  # noqa: BLE001 - retried until the deadline; reported then
            last = error
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}" + (f" (last error: {last})" if last
                                                                                     else ""))
