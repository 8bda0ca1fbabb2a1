"""A node's MIG side without the agent around it: a ledger committed to a real checkpoint directory, a backend
(simulated, or the real nvidia-ml-py over the fake NVML), and crash points. `Crash` stands for kill -9: raised
just before a checkpoint write (it never happened) or just after an NVML change (the card did it); and the end of a
`gpumgr run` test (`finish_agent_run`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from gpumgr.allocator import Ledger
from gpumgr.devices.nvml import NvmlBackend
from gpumgr.mig.manager import MigManager
from gpumgr.mig.types import MigInstance
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.sim.kubeapi import KubeApiServer
from gpumgr.sim.kubelet import KubeletEmulator
from tests.fakes import nvml_node


class Crash(BaseException):
    """The process died here (BaseException: no `except Exception` in the code under test catches it)."""


class Steps:
    """Counts the crash points passed; raises Crash at number `at` (None: never)."""

    def __init__(self, at: int | None):
        self.at, self.n = at, 0

    def point(self) -> None:
        self.n += 1
        if self.at is not None and self.n == self.at:
            raise Crash(self.n)


class CrashingBackend:
    def __init__(self, inner: Any, steps: Steps):
        self.inner, self.steps = inner, steps

    def mig_cards(self) -> Any:
        return self.inner.mig_cards()

    def mig_create(self, index: int, profile_id: int, start: int) -> MigInstance:
        inst = self.inner.mig_create(index, profile_id, start)
        self.steps.point()
        return inst

    def mig_destroy(self, index: int, gi: int) -> bool:
        done = self.inner.mig_destroy(index, gi)
        self.steps.point()
        return bool(done)

    def mig_set_mode(self, index: int, enabled: bool) -> str:
        return str(self.inner.mig_set_mode(index, enabled))


class Node:
    """One agent life: the ledger from the checkpoint in `directory`, changes written before they go live."""

    def __init__(self, directory: Path, card_memory_mib: list[int], backend: Any, steps: Steps):
        self.store = CheckpointStore(directory)
        res = self.store.load()
        self.ledger = res.snapshot.ledger if res.snapshot else Ledger(card_memory_mib)
        self.steps = steps
        self.mig = MigManager(CrashingBackend(backend, steps), self.commit, lambda: self.ledger)

    def commit(self, change: Callable[[Ledger], Any]) -> Any:
        trial = self.ledger.copy()
        result = change(trial)
        self.steps.point()
        self.store.save(trial)
        self.ledger = trial
        return result


@contextmanager
def nvml_lives(tmp_path: Path) -> Iterator[Callable[[], NvmlBackend]]:
    """`open()` -> a new NVML backend over the fake node of the environment (one agent life): the one before is
    closed first, as a dead agent's NVML session is; the last one is closed at the end."""
    opened: list[NvmlBackend] = []

    def open_backend() -> NvmlBackend:
        for b in opened:
            b.close()
        opened.clear()
        b = NvmlBackend(library=str(nvml_node.library()), sysfs_root=str(tmp_path / "no-sysfs"))
        b.inventory()
        opened.append(b)
        return b

    try:
        yield open_backend
    finally:
        for b in opened:
            b.close()


def truth(backend: Any) -> set[tuple[int, int, str, str]]:
    """(card, start, profile, uuid) of every instance the card has."""
    cards = backend.cards() if hasattr(backend, "cards") else backend.mig_cards()
    return {(i.card, i.start, i.profile, i.uuid) for c in cards for i in c.instances}


def recorded(ledger: Ledger) -> set[tuple[int, int, str, str]]:
    return {(s.card, s.start, s.profile, s.uuid) for s in ledger.slots.values()}


async def start_agent_run(workdir: Path, node: Any, labels: dict[str, str]) \
        -> tuple[KubeApiServer, KubeletEmulator, IO[bytes], dict[str, str]]:
    """Begin a `gpumgr run` test: the API test server (kubeconfig in `workdir`, Node `mig-node` with `labels`), the
    kubelet emulator (device plugins in `workdir`/dp), the agent's log file and environment (the fake NVML node's);
    the caller starts the agent with them and ends with `finish_agent_run`."""
    api = KubeApiServer()
    await api.start()
    api.write_kubeconfig(workdir / "kubeconfig")
    api.store.create_node({"metadata": {"name": "mig-node", "labels": labels}})
    kubelet = KubeletEmulator(workdir / "dp")
    await kubelet.start()
    log = open(workdir / "agent.log", "ab")  # noqa: SIM115 - closed by finish_agent_run
    return api, kubelet, log, {**os.environ, **node.env(), "PYTHONFAULTHANDLER": "1"}


async def finish_agent_run(agent: subprocess.Popen[Any], log: IO[Any], kubelet: Any, api: Any, workdir: Path,
                           kept_log: str) -> str:
    """End a `gpumgr run` test: stop the agent (SIGTERM; SIGABRT if it hangs, for its stack), the kubelet emulator
    and the API test server; keep the agent's log as `kept_log` in the temp directory (for a failed run) and remove
    the work directory. Returns the log, for the caller's checks of a clean exit."""
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.send_signal(signal.SIGABRT)
            agent.wait(timeout=10)
    log.close()
    await kubelet.stop()
    await api.stop()
    text = (workdir / "agent.log").read_text(errors="replace")
    Path(tempfile.gettempdir(), kept_log).write_text(text)
    shutil.rmtree(workdir, ignore_errors=True)
    return text
