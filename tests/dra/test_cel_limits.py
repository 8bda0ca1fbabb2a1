"""The scheduler stand-in's CEL selectors are bounded: one expression at most CELSelectorExpressionMaxLength
(10 KiB, counted in bytes as the API server counts them), and the cache of compiled selectors keeps only the most
recently used ones, so a stream of distinct expressions cannot grow memory forever."""

from __future__ import annotations

from typing import Any

import pytest

from gpumgr.dra.config import DRIVER_NAME
from gpumgr.sim.dra_cel import MAX_EXPRESSION, MAX_PROGRAMS, CelError, SelectorCache, device_activation
from gpumgr.sim.dra_scheduler import DraScheduler, Unschedulable
from tests.dra.harness import NODE, NS
from tests.dra.test_scheduler_standin import claim, devices_of, store_with_slice

DEVICE: Any = device_activation(DRIVER_NAME, {"name": "gpu-0", "attributes": {"index": {"int": 0}}})


def padded(size: int, filler: str = "x") -> str:
    """A selector that matches DEVICE, `size` bytes long in UTF-8 (`filler` is 1 or 2 bytes)."""
    head, tail = 'device.driver == "' + DRIVER_NAME + '" || device.driver == "', '"'
    room = size - len((head + tail).encode())
    width = len(filler.encode())
    assert room % width == 0
    return head + filler * (room // width) + tail


def test_a_selector_of_exactly_the_limit_is_evaluated_and_one_byte_more_is_refused():
    cache = SelectorCache()
    assert cache.matches(padded(MAX_EXPRESSION), DEVICE) is True
    with pytest.raises(CelError, match=f"{MAX_EXPRESSION + 1} bytes is longer than the limit of {MAX_EXPRESSION}"):
        cache.matches(padded(MAX_EXPRESSION + 1), DEVICE)


def test_the_limit_counts_bytes_not_characters():
    wide = padded(MAX_EXPRESSION + 2, filler="é")  # 2 bytes each: far fewer characters than the limit
    assert len(wide) < MAX_EXPRESSION
    with pytest.raises(CelError, match="longer than the limit"):
        SelectorCache().program(wide)


def test_a_selector_that_is_not_a_string_is_an_error_not_a_crash():
    with pytest.raises(CelError, match="must be a string, not int"):
        SelectorCache().program(42)  # type: ignore[arg-type]


def test_an_over_long_selector_makes_the_claim_unschedulable_with_a_short_message():
    store = store_with_slice()
    sel = [{"cel": {"expression": padded(MAX_EXPRESSION + 1)}}]
    claim(store, "long", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "selectors": sel}}])
    with pytest.raises(Unschedulable, match="longer than the limit") as e:
        DraScheduler(store).allocate_claim(NS, "long", NODE)
    assert len(str(e.value)) < 1000
    ok = [{"cel": {"expression": padded(MAX_EXPRESSION)}}]
    claim(store, "fits", [{"name": "g", "exactly": {"deviceClassName": "vgpu.gpumgr.io", "selectors": ok}}])
    DraScheduler(store).allocate_claim(NS, "fits", NODE, store.get_pod(NS, "p"))
    assert len(devices_of(store, "fits")) == 1


def test_the_cache_keeps_the_most_recently_used_selectors_only():
    cache = SelectorCache()
    kept, dropped = 'device.driver == "kept"', 'device.driver == "dropped"'
    first_kept, first_dropped = cache.program(kept), cache.program(dropped)
    for i in range(MAX_PROGRAMS * 2):  # a stream of distinct expressions; `kept` stays in use
        cache.program(f'device.driver == "hostile-{i}"')
        assert cache.program(kept) is first_kept
        assert len(cache) <= MAX_PROGRAMS
    assert len(cache) == MAX_PROGRAMS
    assert cache.program(dropped) is not first_dropped  # evicted, compiled again
    assert cache.matches(dropped, DEVICE) is False
