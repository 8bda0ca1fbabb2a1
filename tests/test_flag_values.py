"""Numeric flags of the servers (`gpumgr extender`, `gpumgr webhook`) take one plain grammar: ASCII digits (and a
decimal part for seconds); anything Python's int()/float() would also take (signs, underscores, exponents, nan,
other scripts' digits) is refused with a message naming the flag."""

from __future__ import annotations

import pytest

from gpumgr.commands.common import MIN_SECONDS, seconds_flag, whole_flag
from gpumgr.files.docfile import InputError


@pytest.mark.parametrize("text", ["1_000", "+5", "5e2", "٣٠", "３０", "-1", "", "0x10", "1.0", " "])
def test_whole_numbers_are_plain_digits(text):
    with pytest.raises(InputError, match="--max-connections"):
        whole_flag("--max-connections", text, 1, 10_000)


@pytest.mark.parametrize("text", ["1e3", "1e-300", "+5", "nan", "inf", "1_0", ".5", "5.", "٣", "0", "0.001"])
def test_seconds_are_digits_with_an_optional_decimal_part_and_not_below_the_minimum(text):
    with pytest.raises(InputError, match="--body-timeout"):
        seconds_flag("--body-timeout", text, 600)


def test_plain_values_are_taken():
    assert whole_flag("--max-connections", " 128 ", 1, 10_000) == 128
    assert seconds_flag("--body-timeout", "2.5", 600) == 2.5
    assert seconds_flag("--body-timeout", str(MIN_SECONDS), 600) == MIN_SECONDS
    assert seconds_flag("--body-timeout", "600", 600) == 600
