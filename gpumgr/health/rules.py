"""The health rules: from events, card status and the passing of time to "reason X is (not) present on card i".

No I/O here. `HealthRules` only remembers when each card last had a critical XID (for the recovery timeout);
whether a reason is present now is the node state's business, so every answer is a wanted value, and applying
it twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumgr.devices.types import GPUStatus, HealthEvent
from gpumgr.health.config import ECC, LOST, TEMPERATURE, XID, HealthConfig

ALL_CARDS = -1  # an event's index when the backend could not tell which card it was


class HealthRules:
    def __init__(self, config: HealthConfig, card_count: int):
        self.config = config
        self.card_count = card_count
        self._last_xid: dict[int, float] = {}  # card -> clock reading of its latest critical XID

    def targets(self, index: int) -> list[int]:
        """The cards an event with `index` concerns (all of them for ALL_CARDS; none for an unknown card)."""
        if index == ALL_CARDS:
            return list(range(self.card_count))
        return [index] if 0 <= index < self.card_count else []

    def is_critical_xid(self, xid: int) -> bool:
        return self.config.enabled(XID) and xid not in self.config.ignored_xids

    def on_event(self, event: HealthEvent, now: float) -> list[ReasonChange]:
        """What one event changes. A "lost" event for an unknown card changes nothing here: the caller reads
        every card's status to find the one that is gone."""
        cfg = self.config
        cards = self.targets(event.index)
        if event.kind == "xid":
            if not self.is_critical_xid(event.code):
                return []
            for i in cards:
                self._last_xid[i] = now
            return [ReasonChange(i, XID, True, f"XID {event.code}") for i in cards]
        if event.kind == "ecc":
            if not cfg.enabled(ECC) or event.code <= 0:
                return []
            return [ReasonChange(i, ECC, True, f"{event.code} uncorrectable ECC error(s)") for i in cards]
        if event.kind == "lost":
            if not cfg.enabled(LOST) or event.index == ALL_CARDS:
                return []
            return [ReasonChange(i, LOST, True, event.detail or "fell off the bus") for i in cards]
        if event.kind == "recovered":
            for i in cards:
                self._last_xid.pop(i, None)
            detail = event.detail or "recovered"
            return [ReasonChange(i, r, False, detail) for i in cards for r in (XID, ECC, LOST)]
        return []

    def on_status(self, status: GPUStatus) -> list[ReasonChange]:
        """What a card's current status says about temperature (with hysteresis), about being on the bus, and,
        where the backend counts them, about uncorrectable ECC errors (present while the counter is above 0)."""
        cfg, i = self.config, status.index
        out = []
        if cfg.enabled(LOST):
            out.append(ReasonChange(i, LOST, status.lost, "fell off the bus" if status.lost else "back on the bus"))
        ecc = status.ecc_uncorrected
        if cfg.enabled(ECC) and ecc is not None and not status.lost:
            # The volatile counter only drops to 0 when the card is reset (or the driver reloaded).
            out.append(ReasonChange(i, ECC, ecc > 0, f"{ecc} uncorrectable ECC error(s) counted"
                                    if ecc > 0 else "ECC error counter back to 0 (card reset)"))
        t = status.temperature_c
        if cfg.enabled(TEMPERATURE) and t is not None:
            if t >= cfg.temp_unhealthy_c:
                out.append(ReasonChange(i, TEMPERATURE, True, f"{t} °C >= {cfg.temp_unhealthy_c} °C"))
            elif t < cfg.temp_healthy_c:
                out.append(ReasonChange(i, TEMPERATURE, False, f"{t} °C < {cfg.temp_healthy_c} °C"))
        return out

    def on_tick(self, now: float) -> list[ReasonChange]:
        """XID reasons whose recovery time has passed with no further critical XID."""
        wait = self.config.xid_recovery_s
        if wait is None:
            return []
        due = sorted(i for i, t in self._last_xid.items() if now - t >= wait)
        for i in due:
            del self._last_xid[i]
        return [ReasonChange(i, XID, False, f"no critical XID for {wait:g} s") for i in due]


@dataclass(frozen=True)
class ReasonChange:
    """Reason `reason` should be `present` (or not) on card `index`; `detail` says why, for the log."""

    index: int
    reason: str
    present: bool
    detail: str = ""
