"""The health monitor on the real NVML backend (nvidia-ml-py over the fake libnvidia-ml.so.1), on today's driver
and on older ones: one card's fault takes out that card and no other, and every cause is checked on every driver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gpumgr.health.monitor import HealthConfig, HealthMonitor
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.node.state import NodeState
from tests.fakes.nvml_fixtures import MakeBackend
from tests.fakes.nvml_node import FakeNvmlNode
from tests.health.support import until
from tests.nvml.test_discovery import small_node

pytestmark = pytest.mark.timeout(60)

QUIET = HealthConfig(poll_interval_s=3600, event_wait_s=0.05)  # tests call check_now() for status passes


class Rig:
    def __init__(self, monitor: HealthMonitor, state: NodeState, node: FakeNvmlNode):
        self.monitor, self.state, self.node = monitor, state, node

    def healthy(self) -> list[bool]:
        return [self.state.healthy(i) for i in range(self.state.inventory.count)]

    def reasons(self, i: int) -> set[str]:
        return set(self.state.health_reasons[i])


MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig(make_backend: MakeBackend, tmp_path: Path) -> AsyncIterator[MakeRig]:
    started: list[HealthMonitor] = []

    async def make(variant: str = "current", cards: int = 8) -> Rig:
        backend, node = make_backend(small_node(cards), variant)
        state = NodeState("node-a", backend.inventory(), CheckpointStore(tmp_path / f"ckpt{len(started)}"))
        monitor = HealthMonitor(backend, state, QUIET)
        await monitor.start()
        started.append(monitor)
        return Rig(monitor, state, node)

    yield make
    for m in started:
        await m.stop()


@pytest.mark.parametrize("variant", ["current", "no-wait-v2", "old"])
async def test_xid_79_on_gpu_3_takes_out_gpu_3_only(make_rig: MakeRig, variant: str) -> None:
    rig = await make_rig(variant)
    rig.node.xid(3, 79)
    await until(lambda: not rig.state.healthy(3), "card 3 to turn unhealthy")
    await rig.monitor.check_now()
    assert rig.healthy() == [True, True, True, False, True, True, True, True]
    assert rig.reasons(3) == {"xid"}


async def test_double_bit_ecc_takes_out_its_card_until_the_counter_is_reset(make_rig: MakeRig) -> None:
    rig = await make_rig()
    rig.node.double_bit_ecc(5)
    await until(lambda: not rig.state.healthy(5), "card 5 to turn unhealthy")
    await rig.monitor.check_now()
    assert rig.healthy() == [True] * 5 + [False] + [True] * 2 and rig.reasons(5) == {"ecc"}
    rig.node.ecc_count(5, 0)  # the card was reset: volatile counters start again at 0
    await rig.monitor.check_now()
    assert rig.healthy() == [True] * 8


@pytest.mark.parametrize("variant", ["current", "old"])
async def test_uncorrected_ecc_errors_with_no_event_are_caught_by_the_counter(make_rig: MakeRig,
                                                                               variant: str) -> None:
    rig = await make_rig(variant)
    rig.node.ecc_count(6, 7)
    await rig.monitor.check_now()
    assert rig.healthy() == [True] * 6 + [False, True] and rig.reasons(6) == {"ecc"}


@pytest.mark.parametrize("variant", ["no-procs-v3", "old"])
async def test_older_drivers_still_check_temperature(make_rig: MakeRig, variant: str) -> None:
    rig = await make_rig(variant, cards=4)
    rig.node.temperature(2, 97)
    await rig.monitor.check_now()
    assert rig.healthy() == [True, True, False, True] and rig.reasons(2) == {"temperature"}
    rig.node.temperature(2, 60)
    await rig.monitor.check_now()
    assert rig.healthy() == [True] * 4


@pytest.mark.parametrize("variant", ["current", "no-procs-v3", "old"])
async def test_a_card_that_falls_off_the_bus_comes_back(make_rig: MakeRig, variant: str) -> None:
    rig = await make_rig(variant, cards=4)
    rig.node.fall_off_bus(1)
    await until(lambda: not rig.state.healthy(1), "card 1 to read as lost")
    assert rig.healthy() == [True, False, True, True] and rig.reasons(1) == {"lost"}
    rig.node.back_on_bus(1)
    await rig.monitor.check_now()
    assert rig.healthy() == [True] * 4


@pytest.mark.parametrize("variant", ["current", "old"])
async def test_xid_79_with_the_card_off_the_bus_clears_when_the_card_is_back(make_rig: MakeRig, variant: str) -> None:
    rig = await make_rig(variant, cards=4)
    rig.node.xid(2, 79)
    rig.node.fall_off_bus(2)
    await until(lambda: rig.reasons(2) == {"xid", "lost"}, "card 2 to be unhealthy for xid and lost")
    rig.node.back_on_bus(2)  # it came back: it was reset, which is what clears an XID
    await rig.monitor.check_now()
    await until(lambda: rig.state.healthy(2), "card 2 to be healthy again")
    assert rig.healthy() == [True] * 4
