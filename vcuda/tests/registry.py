"""The list of shim test cases; each module registers its cases with @case."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness import Fixture

CASES: list[Case] = []


def case(title: str, slow: bool = False) -> Callable[[Callable[[Fixture], None]], Callable[[Fixture], None]]:
    def register(fn: Callable[[Fixture], None]) -> Callable[[Fixture], None]:
        CASES.append(Case(title, fn, slow))
        return fn

    return register


@dataclass
class Case:
    title: str
    fn: Callable[[Fixture], None]
    slow: bool
