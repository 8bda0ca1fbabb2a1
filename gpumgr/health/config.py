"""What the health monitor checks and with which thresholds, and the parsing of those settings from text."""

from __future__ import annotations

from dataclasses import dataclass

from gpumgr.requests.podspec import ascii_uint

# Reasons a card can be unhealthy for; each is set and cleared on its own (see NodeState.set_reason).
XID = "xid"
ECC = "ecc"
TEMPERATURE = "temperature"
LOST = "lost"
CHECKS = (XID, ECC, TEMPERATURE, LOST)

# XIDs caused by an application, not by the card (NVIDIA's device plugin ignores the same ones):
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
# 68 video processor exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def parse_xids(text: str) -> frozenset[int]:
    """`"13, 31,43"` -> {13, 31, 43}. An empty string means none. Raises ValueError naming the bad item."""
    out: set[int] = set()
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        xid = ascii_uint(item, 10)
        if xid is None:
            raise ValueError(f"XID list {text[:200]!r}: {item[:40]!r} is not a number (expected e.g. '13,31,43')")
        out.add(xid)
    return frozenset(out)


def parse_checks(text: str) -> frozenset[str]:
    """`"temperature,ecc"` -> the checks to disable; `"all"` disables every check. Raises ValueError on an
    unknown name."""
    out: set[str] = set()
    for item in text.replace(" ", "").lower().split(","):
        if not item:
            continue
        if item == "all":
            out.update(CHECKS)
        elif item in CHECKS:
            out.add(item)
        else:
            raise ValueError(f"health check {item!r} is unknown (expected some of {', '.join(CHECKS)}, or all)")
    return frozenset(out)


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds and switches of the health monitor. Invalid combinations raise ValueError at construction."""

    poll_interval_s: float = 1.0  # how often temperature and "lost" are read from every card
    event_wait_s: float = 0.5  # longest single wait for an event (bounds how long stopping takes)
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    xid_recovery_s: float | None = 300.0  # None: an XID-unhealthy card comes back only on a "recovered" event
    temp_unhealthy_c: int = 95  # at or above: unhealthy
    temp_healthy_c: int = 90  # below: healthy again (in between: unchanged)
    disabled: frozenset[str] = frozenset()  # checks from CHECKS that are switched off

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError(f"health poll interval must be > 0 s, got {self.poll_interval_s}")
        if self.event_wait_s <= 0:
            raise ValueError(f"health event wait must be > 0 s, got {self.event_wait_s}")
        if self.xid_recovery_s is not None and self.xid_recovery_s < 0:
            raise ValueError(f"XID recovery time must be >= 0 s (or unset), got {self.xid_recovery_s}")
        if self.temp_healthy_c > self.temp_unhealthy_c:
            raise ValueError(f"healthy temperature {self.temp_healthy_c} °C is above the unhealthy threshold "
                             f"{self.temp_unhealthy_c} °C; it must be at or below it")
        unknown = set(self.disabled) - set(CHECKS)
        if unknown:
            raise ValueError(f"unknown health check(s) {sorted(unknown)} (expected some of {', '.join(CHECKS)})")

    def enabled(self, check: str) -> bool:
        return check not in self.disabled
