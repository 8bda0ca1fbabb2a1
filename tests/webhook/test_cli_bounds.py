"""`gpumgr webhook` numeric flags: out of range or non-finite values are refused with one line naming the flag
(exit 2, nothing started), from the command line and from the environment; the bounds themselves are accepted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpumgr.serving.body import MAX_CONNECTIONS, MAX_TIMEOUT
from gpumgr.webhook.server import WebhookServer


def webhook(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMGR_")}
    proc = subprocess.run([sys.executable, "-m", "gpumgr.cli", "webhook", "--listen", "127.0.0.1:1", *argv],
                          capture_output=True, text=True, timeout=60, env={**clean, **(env or {})})
    return proc.returncode, proc.stderr


# one value past each flag's bound, through the real CLI (the grammar: tests/test_flag_values.py)
REFUSED = [
    ("--max-connections", str(MAX_CONNECTIONS + 1), "from 1 to 10000"),
    ("--header-timeout", "300.5", "to 300"),
    ("--max-cards-per-container", "4097", "expected a whole number from 1 to 4096"),
]


@pytest.mark.parametrize(("flag", "value", "words"), REFUSED, ids=[f"{f} {v}" for f, v, _ in REFUSED])
def test_out_of_range_and_non_finite_values_are_refused_naming_the_flag(flag: str, value: str, words: str) -> None:
    code, err = webhook([f"{flag}={value}"])  # "=": argparse takes "-inf" alone for a flag
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpumgr webhook: {flag} "), err
    assert words in lines[0] and "Traceback" not in err, err


def test_values_from_the_environment_are_bounded_too() -> None:
    code, err = webhook([], env={"GPUMGR_MAX_CONNECTIONS": "65536"})
    assert code == 2 and err.strip() == "gpumgr webhook: --max-connections '65536': expected a whole number from 1 " \
        "to 10000", err


def test_the_bounds_themselves_are_accepted() -> None:
    """At every upper bound the limits pass; the next check (no certificate given) is what refuses."""
    code, err = webhook(["--max-connections", str(MAX_CONNECTIONS), "--header-timeout", "300",
                         "--max-cards-per-container", "4096"])
    assert code == 2 and err.strip().startswith("gpumgr webhook: --tls-cert-file and --tls-key-file are required"), err


@pytest.mark.parametrize("kw", [{"max_connections": MAX_CONNECTIONS + 1}, {"read_timeout": MAX_TIMEOUT + 1},
                                {"max_body_bytes": 2**40}])
def test_the_server_in_process_refuses_the_same_values(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WebhookServer("gpumgr-scheduler", None, **kw)  # type: ignore[arg-type]
