"""`gpumgr extender` numeric flags have upper bounds too: a value past one (or nan, inf) is refused with one line
naming the flag, exit 2, nothing started; the bounds themselves are accepted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpumgr.serving.body import MAX_BODY_BYTES, MAX_CONNECTIONS, MAX_TIMEOUT, Limits

BASE = ["--insecure-serve-without-auth", "--listen", "127.0.0.1:1"]


def extender(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMGR_")}
    proc = subprocess.run([sys.executable, "-m", "gpumgr.cli", "extender", *BASE, *argv], capture_output=True,
                          text=True, timeout=60, env={**clean, **(env or {})})
    return proc.returncode, proc.stderr


# one value past each flag's bound, through the real CLI (the grammar itself, nan/inf/exponents/signs, is
# tested in-process by tests/test_flag_values.py)
REFUSED = [
    ("--max-body-bytes", str(MAX_BODY_BYTES + 1), "from 1024 to 67108864"),
    ("--header-timeout", "600.001", "to 600"),
    ("--body-timeout", "nan", "timeouts must be positive and finite"),
    ("--max-connections", str(MAX_CONNECTIONS + 1), "from 1 to 10000"),
    ("--leader-elect-retry-period", "1e9", "expected seconds"),
]


@pytest.mark.parametrize(("flag", "value", "words"), REFUSED, ids=[f"{f} {v}" for f, v, _ in REFUSED])
def test_out_of_range_and_non_finite_values_are_refused_naming_the_flag(flag: str, value: str, words: str) -> None:
    code, err = extender([f"{flag}={value}"])  # "=": argparse takes "-inf" alone for a flag
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpumgr extender: {flag} "), err
    assert words in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize(("variable", "value", "flag"), [
    ("GPUMGR_MAX_BODY_BYTES", str(10**12), "--max-body-bytes"),
    ("GPUMGR_HEADER_TIMEOUT", "1e9", "--header-timeout"),
    ("GPUMGR_BODY_TIMEOUT", "inf", "--body-timeout"),
    ("GPUMGR_MAX_CONNECTIONS", str(10**9), "--max-connections"),
])
def test_values_from_the_environment_are_bounded_too(variable: str, value: str, flag: str) -> None:
    code, err = extender([], env={variable: value})
    assert code == 2, err
    assert err.strip().startswith(f"gpumgr extender: {flag} {value!r}:") and len(err.strip().splitlines()) == 1, err


def test_the_bounds_themselves_are_accepted() -> None:
    """At every upper bound the limits pass; the next check (--probe-listen, read after them) is what refuses."""
    code, err = extender(["--max-body-bytes", str(MAX_BODY_BYTES), "--header-timeout", f"{MAX_TIMEOUT:g}",
                          "--body-timeout", f"{MAX_TIMEOUT:g}", "--max-connections", str(MAX_CONNECTIONS),
                          "--probe-listen", "nowhere"])
    assert code == 2 and err.strip() == "gpumgr extender: --probe-listen 'nowhere': expected HOST:PORT with a port " \
        "from 1 to 65535", err


@pytest.mark.parametrize("kw", [{"max_body_bytes": MAX_BODY_BYTES + 1}, {"header_timeout": MAX_TIMEOUT * 2},
                                {"body_timeout": float("inf")}, {"max_connections": MAX_CONNECTIONS + 1}])
def test_limits_in_process_refuse_the_same_values(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="max_body_bytes|timeouts|max_connections"):
        Limits(**kw)  # type: ignore[arg-type]
