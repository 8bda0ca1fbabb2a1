"""The ECC rule on status reads: a card's volatile uncorrected ECC counter, where the backend reads one, sets the
`ecc` reason while it is above 0 and clears it when a reset brings it back to 0; no counter changes nothing."""

from __future__ import annotations

from gpumgr.devices.types import GPUStatus
from gpumgr.health.config import ECC, HealthConfig
from gpumgr.health.rules import HealthRules, ReasonChange


def ecc_changes(status: GPUStatus, config: HealthConfig | None = None) -> list[ReasonChange]:
    return [c for c in HealthRules(config or HealthConfig(), 4).on_status(status) if c.reason == ECC]


def test_counted_errors_set_the_reason_and_a_zero_count_clears_it():
    (on,) = ecc_changes(GPUStatus(index=2, ecc_uncorrected=7))
    assert (on.index, on.present) == (2, True) and "7 uncorrectable" in on.detail
    (off,) = ecc_changes(GPUStatus(index=2, ecc_uncorrected=0))
    assert (off.index, off.present) == (2, False)


def test_no_counter_a_lost_card_or_the_check_off_change_nothing():
    assert ecc_changes(GPUStatus(index=1)) == []
    assert ecc_changes(GPUStatus(index=1, ecc_uncorrected=3, lost=True)) == []
    assert ecc_changes(GPUStatus(index=1, ecc_uncorrected=3), HealthConfig(disabled=frozenset({ECC}))) == []
