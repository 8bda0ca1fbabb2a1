"""The health monitor against the simulated backend and a real NodeState: events and status turn cards unhealthy
and healthy again, through `state.ledger`, `state.health_reasons` and `state.version`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gpumgr.allocator import Allocation, LedgerError
from gpumgr.devices.types import HealthEvent
from gpumgr.health.monitor import DEFAULT_IGNORED_XIDS, HealthConfig, parse_checks, parse_xids
from tests.health.support import CARDS, Rig, build_rig, until

pytestmark = pytest.mark.timeout(30)

# The poll loop runs once at start; tests call check_now() for the status passes they want.
QUIET = HealthConfig(poll_interval_s=3600, event_wait_s=0.05)
MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[MakeRig]:
    started: list[Rig] = []

    async def make(config: HealthConfig = QUIET, setup: Callable[[Rig], None] | None = None) -> Rig:
        rig = build_rig(tmp_path / f"rig{len(started)}", config)
        if setup is not None:
            setup(rig)
        await rig.monitor.start()
        started.append(rig)
        return rig

    yield make
    for rig in started:
        await rig.monitor.stop()


@pytest.fixture
async def rig(make_rig: MakeRig) -> Rig:
    return await make_rig()


async def unhealthy(rig: Rig, index: int) -> None:
    await until(lambda: not rig.state.ledger.cards[index].healthy, f"card {index} to turn unhealthy")


async def healthy(rig: Rig, index: int) -> None:
    await until(lambda: rig.state.ledger.cards[index].healthy, f"card {index} to turn healthy")


# -- XID ----------------------------------------------------------------------------------------------------------
async def test_critical_xid_makes_the_card_unhealthy_and_wakes_watchers(rig: Rig) -> None:
    before = rig.state.version
    rig.sim.inject_xid(1, 79)
    await unhealthy(rig, 1)
    assert rig.healthy() == [True, False, True, True]
    assert not rig.state.healthy(1)
    assert rig.reasons(1) == {"xid"}
    assert rig.state.version > before
    assert rig.transitions == [(1, False, "xid")]
    assert rig.xids == [(1, 79)]


async def test_unhealthy_card_takes_no_new_allocation(rig: Rig) -> None:
    rig.sim.inject_xid(2, 48)
    await unhealthy(rig, 2)
    with pytest.raises(LedgerError, match="unhealthy"):
        await rig.state.commit(lambda ledger: ledger.assign(Allocation(key="ns/p/c", cards=(2,), cores=100)))
    await rig.state.commit(lambda ledger: ledger.assign(Allocation(key="ns/p/c", cards=(3,), cores=100)))


async def test_application_xids_are_ignored_but_counted(rig: Rig) -> None:
    before = rig.state.version
    for xid in sorted(DEFAULT_IGNORED_XIDS):
        rig.sim.inject_xid(0, xid)
    rig.sim.inject_xid(3, 79)  # a marker: events are handled in order, so the ignored ones were seen first
    await unhealthy(rig, 3)
    assert rig.healthy() == [True, True, True, False]
    assert rig.state.version == before + 1
    assert rig.transitions == [(3, False, "xid")]
    assert rig.xids == [(0, x) for x in sorted(DEFAULT_IGNORED_XIDS)] + [(3, 79)]


async def test_ignored_xid_list_is_configurable(make_rig: MakeRig) -> None:
    rig = await make_rig(HealthConfig(poll_interval_s=3600, event_wait_s=0.05, ignored_xids=frozenset({79})))
    rig.sim.inject_xid(0, 79)
    rig.sim.inject_xid(1, 13)  # ignored by default, critical here
    await unhealthy(rig, 1)
    assert rig.healthy() == [True, False, True, True]


async def test_repeated_xids_report_one_transition(rig: Rig) -> None:
    for _ in range(3):
        rig.sim.inject_xid(0, 79)
    rig.sim.inject_xid(1, 79)
    await unhealthy(rig, 1)
    await until(lambda: len(rig.xids) == 4, "all four XIDs")
    assert rig.transitions == [(0, False, "xid"), (1, False, "xid")]


async def test_xid_for_an_unknown_card_applies_to_every_card(rig: Rig) -> None:
    rig.backend.push(HealthEvent(index=-1, kind="xid", code=79))
    await until(lambda: not any(rig.healthy()), "every card to turn unhealthy")
    assert sorted(rig.transitions) == [(i, False, "xid") for i in range(CARDS)]
    assert rig.xids == [(-1, 79)]
    rig.backend.push(HealthEvent(index=-1, kind="recovered"))
    await until(lambda: all(rig.healthy()), "every card to recover")
    assert sorted(rig.transitions[CARDS:]) == [(i, True, "xid") for i in range(CARDS)]


async def test_event_for_a_card_the_node_lacks_changes_nothing(rig: Rig) -> None:
    rig.backend.push(HealthEvent(index=9, kind="xid", code=79))
    rig.sim.inject_xid(0, 79)
    await unhealthy(rig, 0)
    assert rig.healthy() == [False, True, True, True]
    assert rig.transitions == [(0, False, "xid")]


# -- XID recovery -------------------------------------------------------------------------------------------------
async def test_xid_reason_expires_after_the_recovery_time(rig: Rig) -> None:
    rig.sim.inject_xid(0, 79)
    await unhealthy(rig, 0)
    rig.clock.now = 299.0
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False
    rig.clock.now = 300.0
    await rig.monitor.check_now()
    assert rig.healthy()[0] is True
    assert rig.transitions == [(0, False, "xid"), (0, True, "xid")]


async def test_a_new_critical_xid_restarts_the_recovery_time(rig: Rig) -> None:
    rig.sim.inject_xid(0, 79)
    await unhealthy(rig, 0)
    rig.clock.now = 200.0
    rig.sim.inject_xid(0, 94)
    await until(lambda: len(rig.xids) == 2, "the second XID")
    rig.clock.now = 300.0
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False
    rig.clock.now = 500.0
    await rig.monitor.check_now()
    assert rig.healthy()[0] is True
    assert rig.transitions == [(0, False, "xid"), (0, True, "xid")]


async def test_an_ignored_xid_does_not_restart_the_recovery_time(rig: Rig) -> None:
    rig.sim.inject_xid(0, 79)
    await unhealthy(rig, 0)
    rig.clock.now = 200.0
    rig.sim.inject_xid(0, 13)
    await until(lambda: len(rig.xids) == 2, "the ignored XID")
    rig.clock.now = 300.0
    await rig.monitor.check_now()
    assert rig.healthy()[0] is True


async def test_without_a_recovery_time_only_a_recovered_event_clears_an_xid(make_rig: MakeRig) -> None:
    rig = await make_rig(HealthConfig(poll_interval_s=3600, event_wait_s=0.05, xid_recovery_s=None))
    rig.sim.inject_xid(0, 79)
    await unhealthy(rig, 0)
    rig.clock.now = 1e9
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False
    rig.sim.recover(0)
    await healthy(rig, 0)
    assert rig.transitions == [(0, False, "xid"), (0, True, "xid")]


async def test_recovered_event_clears_an_xid_at_once(rig: Rig) -> None:
    rig.sim.inject_xid(2, 79)
    await unhealthy(rig, 2)
    rig.sim.recover(2)
    await healthy(rig, 2)
    rig.clock.now = 1000.0  # the expired timer must not report a second recovery
    await rig.monitor.check_now()
    assert rig.transitions == [(2, False, "xid"), (2, True, "xid")]


# -- ECC ----------------------------------------------------------------------------------------------------------
async def test_uncorrectable_ecc_errors_last_until_recovered(rig: Rig) -> None:
    rig.sim.inject_ecc(1, 2)
    await unhealthy(rig, 1)
    assert rig.reasons(1) == {"ecc"}
    rig.clock.now = 1e6  # no timeout for ECC
    await rig.monitor.check_now()
    assert rig.healthy()[1] is False
    rig.sim.recover(1)
    await healthy(rig, 1)
    assert rig.transitions == [(1, False, "ecc"), (1, True, "ecc")]


async def test_ecc_event_without_errors_changes_nothing(rig: Rig) -> None:
    rig.sim.inject_ecc(0, 0)
    rig.sim.inject_ecc(1, 1)
    await unhealthy(rig, 1)
    assert rig.healthy() == [True, False, True, True]


# -- temperature --------------------------------------------------------------------------------------------------
async def test_temperature_has_hysteresis(rig: Rig) -> None:
    rig.sim.set_temperature(2, 96)
    await rig.monitor.check_now()
    assert rig.healthy()[2] is False
    assert rig.reasons(2) == {"temperature"}
    rig.sim.set_temperature(2, 92)
    await rig.monitor.check_now()
    assert rig.healthy()[2] is False
    rig.sim.set_temperature(2, 89)
    await rig.monitor.check_now()
    assert rig.healthy()[2] is True
    assert rig.transitions == [(2, False, "temperature"), (2, True, "temperature")]


async def test_temperature_thresholds_are_inclusive_above_and_exclusive_below(rig: Rig) -> None:
    rig.sim.set_temperature(0, 94)
    await rig.monitor.check_now()
    assert rig.healthy()[0] is True
    rig.sim.set_temperature(0, 95)
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False
    rig.sim.set_temperature(0, 90)
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False


async def test_temperature_thresholds_are_configurable(make_rig: MakeRig) -> None:
    rig = await make_rig(HealthConfig(poll_interval_s=3600, event_wait_s=0.05, temp_unhealthy_c=80,
                                      temp_healthy_c=70))
    rig.sim.set_temperature(0, 85)
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False
    rig.sim.set_temperature(0, 75)
    await rig.monitor.check_now()
    assert rig.healthy()[0] is False
    rig.sim.set_temperature(0, 69)
    await rig.monitor.check_now()
    assert rig.healthy()[0] is True


async def test_poll_loop_reads_temperature_by_itself(make_rig: MakeRig) -> None:
    rig = await make_rig(HealthConfig(poll_interval_s=0.02, event_wait_s=0.05))
    rig.sim.set_temperature(3, 99)
    await unhealthy(rig, 3)
    rig.sim.set_temperature(3, 50)
    await healthy(rig, 3)
    assert rig.transitions == [(3, False, "temperature"), (3, True, "temperature")]


async def test_a_card_already_hot_at_start_is_unhealthy_from_the_first_pass(make_rig: MakeRig) -> None:
    rig = await make_rig(setup=lambda r: r.sim.set_temperature(1, 97))
    assert rig.healthy() == [True, False, True, True]  # start() returns once every card has been read
    assert rig.transitions == [(1, False, "temperature")]


# -- off the bus --------------------------------------------------------------------------------------------------
async def test_card_that_fell_off_the_bus_is_unhealthy_until_it_is_back(rig: Rig) -> None:
    rig.sim.fall_off_bus(3)
    await unhealthy(rig, 3)
    assert rig.reasons(3) == {"lost"}
    await rig.monitor.check_now()  # status agrees: still lost
    assert rig.healthy()[3] is False
    rig.sim.recover(3)
    await healthy(rig, 3)
    assert rig.transitions == [(3, False, "lost"), (3, True, "lost")]


async def test_lost_seen_only_in_status_and_back_when_status_says_so(rig: Rig) -> None:
    rig.backend.lost.add(1)
    await rig.monitor.check_now()
    assert rig.reasons(1) == {"lost"}
    rig.backend.lost.discard(1)
    await rig.monitor.check_now()
    assert rig.healthy()[1] is True
    assert rig.transitions == [(1, False, "lost"), (1, True, "lost")]


async def test_lost_event_for_an_unknown_card_marks_the_card_whose_status_is_lost(rig: Rig) -> None:
    rig.backend.lost.add(2)
    rig.backend.push(HealthEvent(index=-1, kind="lost", detail="a GPU fell off the bus"))
    await unhealthy(rig, 2)
    assert rig.healthy() == [True, True, False, True]
    assert rig.transitions == [(2, False, "lost")]


# -- reasons are independent --------------------------------------------------------------------------------------
async def test_clearing_one_reason_leaves_the_card_unhealthy_while_another_remains(rig: Rig) -> None:
    rig.sim.inject_xid(0, 79)
    await unhealthy(rig, 0)
    rig.sim.set_temperature(0, 96)
    await rig.monitor.check_now()
    assert rig.reasons(0) == {"xid", "temperature"}
    rig.sim.set_temperature(0, 80)
    await rig.monitor.check_now()
    assert rig.reasons(0) == {"xid"}
    assert rig.healthy()[0] is False
    rig.sim.recover(0)
    await healthy(rig, 0)
    assert rig.transitions == [(0, False, "xid"), (0, True, "xid")]


async def test_recovered_event_does_not_clear_a_measured_temperature(rig: Rig) -> None:
    rig.sim.set_temperature(1, 96)
    await rig.monitor.check_now()
    rig.sim.inject_xid(1, 79)
    rig.sim.recover(1)
    rig.sim.inject_xid(3, 79)  # a marker: handled after the recovery
    await unhealthy(rig, 3)
    assert rig.reasons(1) == {"temperature"}
    assert rig.healthy()[1] is False
    assert rig.transitions == [(1, False, "temperature"), (3, False, "xid")]


# -- configuration and robustness ---------------------------------------------------------------------------------
async def test_disabled_checks_change_nothing(make_rig: MakeRig) -> None:
    rig = await make_rig(HealthConfig(poll_interval_s=3600, event_wait_s=0.05,
                                      disabled=frozenset({"temperature", "xid"})))
    rig.sim.set_temperature(0, 120)
    rig.sim.inject_xid(1, 79)
    rig.sim.inject_ecc(2, 1)  # the marker: ECC is still checked
    await unhealthy(rig, 2)
    await rig.monitor.check_now()
    assert rig.healthy() == [True, True, False, True]
    assert rig.xids == [(1, 79)]  # still counted


async def test_a_card_whose_status_cannot_be_read_is_left_alone(rig: Rig) -> None:
    rig.backend.unreadable.add(1)
    rig.sim.set_temperature(1, 99)
    rig.sim.set_temperature(0, 99)
    await rig.monitor.check_now()
    assert rig.healthy() == [False, True, True, True]


async def test_a_failing_callback_does_not_stop_the_monitor(tmp_path: Path) -> None:
    rig = build_rig(tmp_path, QUIET)
    seen: list[int] = []

    def explode(index: int, healthy_now: bool, reason: str) -> None:
        seen.append(index)
        raise RuntimeError("metrics are broken")

    rig.monitor.on_transition = explode
    await rig.monitor.start()
    try:
        rig.sim.inject_xid(0, 79)
        await unhealthy(rig, 0)
        rig.sim.inject_xid(1, 79)
        await unhealthy(rig, 1)
        assert seen == [0, 1]
    finally:
        await rig.monitor.stop()


async def test_stop_ends_the_run_and_start_again_works(tmp_path: Path) -> None:
    rig = build_rig(tmp_path, QUIET)
    await rig.monitor.start()
    await rig.monitor.stop()
    await rig.monitor.stop()  # twice is harmless
    await rig.monitor.start()
    try:
        rig.sim.inject_xid(0, 79)
        await unhealthy(rig, 0)
    finally:
        await rig.monitor.stop()


@pytest.mark.parametrize("kwargs, words", [
    ({"temp_healthy_c": 96, "temp_unhealthy_c": 95}, "above the unhealthy threshold"),
    ({"poll_interval_s": 0}, "poll interval"),
    ({"xid_recovery_s": -1}, "XID recovery"),
    ({"disabled": frozenset({"fan"})}, "unknown health check"),
])
def test_invalid_config_is_refused_with_a_clear_message(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        HealthConfig(**kwargs)  # type: ignore[arg-type]


def test_settings_parse_from_text() -> None:
    assert parse_xids(" 13, 31,,43 ") == frozenset({13, 31, 43})
    assert parse_xids("") == frozenset()
    assert parse_checks("Temperature, ecc") == frozenset({"temperature", "ecc"})
    assert parse_checks("all") == frozenset({"xid", "ecc", "temperature", "lost"})
    with pytest.raises(ValueError, match="'x13' is not a number"):
        parse_xids("31,x13")
    for unicode_digits in ("\u0661\u0663", "\uff11\uff13", "\u00b2"):  # int() would take the first two as 13
        with pytest.raises(ValueError, match="is not a number"):
            parse_xids(unicode_digits)
    with pytest.raises(ValueError, match="'fan' is unknown"):
        parse_checks("ecc,fan")
