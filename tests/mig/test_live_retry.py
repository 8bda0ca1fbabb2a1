"""A live layout refused because a card is held is not tried again (no NVML call, no layouts-file read) at every
node read while nothing changed: only once the ledger changed (the holder went) or after live.RETRY_READS reads.
Through the real nvidia-ml-py over the fake NVML, with a backend that counts the MIG calls the agent makes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpumgr.allocator import Allocation
from gpumgr.devices.types import GPU, Inventory
from gpumgr.mig import agent as mig_agent
from gpumgr.mig import layout as lay
from gpumgr.mig import live
from gpumgr.mig.types import MigInstance
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.mig.harness import nvml_lives

INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-retry", minor=i, name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920) for i in range(2)), levels=(("X", "NV18"), ("NV18", "X")))
SHARE = "a" + "7" * 24


class CountingBackend:
    """The NVML backend, counting the MIG calls made through it."""

    def __init__(self, inner: Any):
        self.inner, self.calls = inner, 0
        self.on_create: Callable[[], object] | None = None  # run (once) at the next instance made


    def mig_cards(self) -> Any:
        self.calls += 1
        return self.inner.mig_cards()

    def mig_create(self, index: int, profile_id: int, start: int) -> MigInstance:
        self.calls += 1
        hook, self.on_create = self.on_create, None
        if hook is not None:
            hook()
        return self.inner.mig_create(index, profile_id, start)  # type: ignore[no-any-return]

    def mig_destroy(self, index: int, gi: int) -> bool:
        self.calls += 1
        return bool(self.inner.mig_destroy(index, gi))

    def mig_set_mode(self, index: int, enabled: bool) -> str:
        self.calls += 1
        return str(self.inner.mig_set_mode(index, enabled))


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingBackend]:
    nvml_node.build()
    node = FakeNvmlNode(tmp_path / "fake", INV, mig={0: "h100-80", 1: "h100-80"}, mig_on=(0, 1)).write()
    monkeypatch.setenv(nvml_node.ENV, str(node.spec))
    with nvml_lives(tmp_path) as open_backend:
        yield CountingBackend(open_backend())


async def test_a_refused_layout_is_tried_again_when_a_holder_goes_not_at_every_read(backend: CountingBackend,
                                                                                    tmp_path: Path):
    held = await _card_0_held(backend, tmp_path)
    state, rt, asked, watcher, changes = held.state, held.rt, held.asked, held.watcher, held.changes
    assert rt.report.refused == [] and len(state.ledger.slots) == 14

    asked[lay.LABEL] = "all-3g.40gb"
    assert await watcher.check() is True  # card 1 re-made, card 0 refused (held)
    assert rt.layout_refused and "is in use by" in rt.report.refused[0]
    assert sorted(s.profile for s in state.ledger.slots.values() if s.card == 1) == ["3g.40gb", "3g.40gb"]

    assert await watcher.check() is False  # card 1's changes were the ledger's: one more pass finds them
    calls = backend.calls
    for _ in range(live.RETRY_READS - 2):  # the 15 s node reads while the holder stays: the same refusal
        assert await watcher.check() is False
    assert backend.calls == calls  # before: one pass over NVML (mig_cards) at every read

    await state.commit(lambda led: led.release(SHARE))  # the holder goes: the next read applies the layout
    assert await watcher.check() is True
    assert backend.calls > calls and not rt.layout_refused and rt.report.refused == []
    assert sorted(s.profile for s in state.ledger.slots.values()) == ["3g.40gb"] * 4
    assert len(changes) == 2


async def test_a_refusal_nothing_in_the_ledger_explains_is_tried_again_after_retry_reads(backend: CountingBackend,
                                                                                         tmp_path: Path):
    state = NodeState("node-a", INV, CheckpointStore(tmp_path / "ckpt"))

    async def labels() -> dict[str, str]:
        return {lay.LABEL: "all-1g.10gb"}

    rt = await mig_agent.start(state, backend, mig_agent.MigSettings(), labels)
    assert rt is not None
    rt.layout_refused = True  # as if a card had refused (an Ampere card waiting for its reset)
    watcher = live.LiveLayout(rt, state, labels, lambda report: _nothing())
    calls = backend.calls
    for _ in range(live.RETRY_READS - 1):
        assert await watcher.check() is False
    assert backend.calls == calls
    await watcher.check()  # the RETRY_READS-th read tries again, and now nothing is refused
    assert backend.calls > calls and not rt.layout_refused


async def test_a_holder_that_goes_while_a_layout_is_tried_is_seen_at_the_next_read(backend: CountingBackend,
                                                                                  tmp_path: Path):
    held = await _card_0_held(backend, tmp_path)
    state, rt, asked, watcher = held.state, held.rt, held.asked, held.watcher
    loop = asyncio.get_running_loop()
    # card 0 is refused (held); while card 1 is re-made (NVML, on the try's thread), card 0's holder goes
    backend.on_create = lambda: asyncio.run_coroutine_threadsafe(
        state.commit(lambda led: led.release(SHARE)), loop).result()
    asked[lay.LABEL] = "all-3g.40gb"
    assert await watcher.check() is True
    assert rt.layout_refused and state.ledger.held_by(SHARE) is None
    assert await watcher.check() is True  # before: skipped until the RETRY_READS-th read (5 min)
    assert not rt.layout_refused and sorted(s.profile for s in state.ledger.slots.values()) == ["3g.40gb"] * 4


async def _nothing() -> None:
    return None


@dataclass
class Held:
    state: NodeState
    rt: Any
    asked: dict[str, str]
    watcher: live.LiveLayout
    changes: list[lay.Report]


async def _card_0_held(backend: CountingBackend, tmp_path: Path) -> Held:
    """An agent started with all-1g.10gb on two H100s, watching the layout label (`asked`), one share on card 0."""
    state = NodeState("node-a", INV, CheckpointStore(tmp_path / "ckpt"))
    asked = {lay.LABEL: "all-1g.10gb"}
    changes: list[lay.Report] = []

    async def labels() -> dict[str, str]:
        return dict(asked)

    async def on_change(report: lay.Report) -> None:
        changes.append(report)

    rt = await mig_agent.start(state, backend, mig_agent.MigSettings(), labels)
    assert rt is not None
    watcher = live.LiveLayout(rt, state, labels, on_change)
    slot = next(s.name for s in state.ledger.slots.values() if s.card == 0)
    await state.commit(lambda led: led.assign(Allocation(key=SHARE, cards=(0,), cores=50, memory_mib=1024, mig=slot)))
    return Held(state, rt, asked, watcher, changes)
