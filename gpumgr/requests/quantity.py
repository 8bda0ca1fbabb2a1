"""Kubernetes resource quantities (`4Gi`, `30`, `1500m`, `1e3`) as exact integers, and back."""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18)}
_FORM = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d{1,3})|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")
MAX_TEXT = 64


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse(value: object) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    text = str(value).strip()
    m = _FORM.match(text) if len(text) <= MAX_TEXT else None
    if not m:
        raise QuantityError(f"not a quantity: {text[:MAX_TEXT]!r}")
    sign, number, exponent, suffix = m.groups()
    amount = Fraction(number)
    if exponent:
        amount *= Fraction(10) ** int(exponent[1:])
    elif suffix in _BINARY:
        amount *= _BINARY[suffix]
    else:
        amount *= _DECIMAL[suffix or ""]
    return -amount if sign == "-" else amount


def parse_int(value: object) -> int:
    """A quantity rounded up to a whole number, as Kubernetes does for integer amounts."""
    q = parse(value)
    return -((-q.numerator) // q.denominator)


def format_bytes(n: int) -> str:
    """The shortest exact binary form: 4294967296 -> `4Gi`."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)
