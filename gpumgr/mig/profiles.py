"""GPU-instance profiles per MIG-capable card family (what NVML lists; used by the simulated backend and to
recognise a card by name). Sizes count memory slices; boards with 7 compute slices have 8 memory slices.
Sources: NVIDIA's MIG user guide and mig-parted's default configuration (docs/mig.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumgr.mig.types import MigProfile


@dataclass(frozen=True)
class Family:
    key: str
    hopper: bool  # switches MIG mode without a reset
    compute_slices: int
    memory_slices: int
    sm_per_slice: int
    # (id, name, compute slices, memory slices, max instances, placement starts)
    rows: tuple[tuple[int, str, int, int, int, tuple[int, ...]], ...]

    def profiles(self, card_memory_mib: int) -> tuple[MigProfile, ...]:
        return tuple(MigProfile(id=i, name=name, slices=s, memory_slices=m,
                                memory_mib=profile_memory_mib(card_memory_mib, m, self.memory_slices),
                                max_count=n, multiprocessors=s * self.sm_per_slice, starts=starts)
                     for i, name, s, m, n, starts in self.rows)


def profile_memory_mib(card_mib: int, slices: int, total: int) -> int:
    """A little under the share of the parent, as real cards report it (and as the fake NVML does)."""
    return (card_mib * slices // total) // 256 * 256 - 256


def _big(key: str, hopper: bool, sm: int, m1: str, m2: str, m3: str, m7: str) -> Family:
    seven, even = (0, 1, 2, 3, 4, 5, 6), (0, 2, 4, 6)
    return Family(key, hopper, 7, 8, sm, (
        (19, f"1g.{m1}gb", 1, 1, 7, seven), (20, f"1g.{m1}gb+me", 1, 1, 1, seven),
        (15, f"1g.{m2}gb", 1, 2, 4, even), (14, f"2g.{m2}gb", 2, 2, 3, (0, 2, 4)),
        (9, f"3g.{m3}gb", 3, 4, 2, (0, 4)), (5, f"4g.{m3}gb", 4, 4, 1, (0,)), (0, f"7g.{m7}gb", 7, 8, 1, (0,)),
    ))


FAMILIES: dict[str, Family] = {f.key: f for f in (
    _big("a100-40", False, 14, "5", "10", "20", "40"),
    _big("a100-80", False, 14, "10", "20", "40", "80"),
    _big("h100-80", True, 16, "10", "20", "40", "80"),
    _big("h200", True, 16, "18", "35", "71", "141"),
    Family("a30", False, 4, 4, 14, (
        (14, "1g.6gb", 1, 1, 4, (0, 1, 2, 3)), (21, "1g.6gb+me", 1, 1, 1, (0, 1, 2, 3)),
        (5, "2g.12gb", 2, 2, 2, (0, 2)), (6, "2g.12gb+me", 2, 2, 1, (0, 2)), (0, "4g.24gb", 4, 4, 1, (0,)),
    )),
)}


def family_of(gpu_name: str, memory_mib: int) -> Family | None:
    """The MIG family of a card by its NVML name (None: not MIG-capable, as far as gpumgr knows)."""
    name = gpu_name.upper()
    if "A30" in name:
        return FAMILIES["a30"]
    if "H200" in name:
        return FAMILIES["h200"]
    if "H100" in name:
        return FAMILIES["h100-80"]
    if "A100" in name:
        return FAMILIES["a100-80" if memory_mib > 50_000 else "a100-40"]
    return None
