"""The list of shim test cases; each module registers its cases with @case."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness import Fixture

CASES: list[Case] = []


def case(
    title: str, slow: bool = False, alone: bool = False
) -> Callable[[Callable[[Fixture], None]], Callable[[Fixture], None]]:
    """slow: a long case (compute measured over seconds); alone: a burst of CPU work (hundreds of processes, busy
    loops) that runs after the others, by itself, so that it cannot starve a compute case's measurement."""

    def register(fn: Callable[[Fixture], None]) -> Callable[[Fixture], None]:
        CASES.append(Case(title, fn, slow, alone))
        return fn

    return register


@dataclass
class Case:
    title: str
    fn: Callable[[Fixture], None]
    slow: bool
    alone: bool = False
