"""A request for GPU resources, checked before anything is chosen."""

from __future__ import annotations

from dataclasses import dataclass

HUNDRED = 100  # vcuda-core units in one whole card


class InvalidRequest(ValueError):
    """The request can never be satisfied as asked; the message says what is wrong."""


@dataclass(frozen=True)
class Request:
    """`cores`: vcuda-core (100 = one card). `memory_mib`: memory on the (one) card for a fractional request."""

    cores: int
    memory_mib: int = 0

    @property
    def evaluator(self) -> str:
        if self.cores > HUNDRED:
            return "link"
        if self.cores == HUNDRED:
            return "fragment"
        return "share"

    @property
    def whole(self) -> bool:
        return self.cores >= HUNDRED

    @property
    def cards_needed(self) -> int:
        return self.cores // HUNDRED if self.whole else 1

    def validate(self, card_count: int, largest_card_mib: int) -> None:
        """Raise InvalidRequest when no node of this shape could ever satisfy the request."""
        if not isinstance(self.cores, int) or not isinstance(self.memory_mib, int):
            raise InvalidRequest("vcuda-core and vcuda-memory must be whole numbers")
        if self.cores < 0 or self.memory_mib < 0:
            raise InvalidRequest(f"negative request: vcuda-core={self.cores}, memory={self.memory_mib} MiB")
        if self.cores == 0:
            raise InvalidRequest("vcuda-core must be greater than 0 (memory alone cannot be allocated)")
        if self.cores > HUNDRED and self.cores % HUNDRED:
            raise InvalidRequest(
                f"vcuda-core={self.cores}: more than one card must be a multiple of 100 (whole cards)"
            )
        if not self.whole and self.memory_mib == 0:
            raise InvalidRequest(f"vcuda-core={self.cores} is a share of a card and needs vcuda-memory > 0")
        if not self.whole and self.memory_mib > largest_card_mib:
            raise InvalidRequest(
                f"asks {self.memory_mib} MiB on one card, but the largest card has {largest_card_mib} MiB"
            )
        if self.whole and self.cards_needed > card_count:
            raise InvalidRequest(f"asks {self.cards_needed} whole cards, but the node has {card_count}")
        if self.whole and self.memory_mib > largest_card_mib * self.cards_needed:
            raise InvalidRequest(
                f"asks {self.memory_mib} MiB on {self.cards_needed} card(s) of at most {largest_card_mib} MiB"
            )
