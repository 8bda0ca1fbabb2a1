"""`gpumgr extender` leader-election flags: bad values are refused with one line and exit 2, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CASES = [
    (["--leader-elect-lease-duration", "1.5"], "--leader-elect-lease-duration 1.5: expected whole seconds"),
    (["--leader-elect-lease-duration", "0"], "--leader-elect-lease-duration 0: expected whole seconds"),
    (["--leader-elect-lease-duration", "99999"], "from 1 to 3600"),
    (["--leader-elect-lease-duration", "fifteen"], "--leader-elect-lease-duration 'fifteen': expected seconds"),
    (["--leader-elect-lease-duration", "\u0661\u0665"], "expected seconds"),  # Arabic-Indic digits
    (["--leader-elect-renew-deadline", "1e3"], "--leader-elect-renew-deadline '1e3': expected seconds"),
    (["--leader-elect-renew-deadline", "15"], "at least 1s less than --leader-elect-lease-duration (15)"),
    (["--leader-elect-renew-deadline", "14.5"], "at least 1s less than --leader-elect-lease-duration (15)"),
    (["--leader-elect-retry-period", "10"], "--leader-elect-renew-deadline (10) at least 1.2 times it"),
    (["--leader-elect-retry-period", "9"], "--leader-elect-renew-deadline (10) at least 1.2 times it"),
    (["--leader-elect-retry-period", "0.01"], "at least 0.05"),
    (["--leader-elect-lease-name", "Bad_Name"], "--leader-elect-lease-name 'Bad_Name': expected a lowercase DNS"),
    (["--leader-elect-lease-name", "a..b"], "--leader-elect-lease-name 'a..b': expected a lowercase DNS"),
    (["--leader-elect-lease-name", "a.-b"], "--leader-elect-lease-name 'a.-b': expected a lowercase DNS"),
    (["--leader-elect-namespace", "kube system"], "--leader-elect-namespace 'kube system': expected a namespace"),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_election_flags_exit_2_with_one_line(argv: list[str], words: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpumgr.cli", "extender", "--insecure-serve-without-auth",
                           "--leader-elect", "--listen", "127.0.0.1:1", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_bad_values_from_the_environment_are_refused_too() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpumgr.cli", "extender", "--insecure-serve-without-auth"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPUMGR_LEADER_ELECT_RETRY_PERIOD": "-1"})
    assert proc.returncode == 2 and "--leader-elect-retry-period '-1': expected seconds" in proc.stderr


@pytest.mark.parametrize("name", ["gpumgr", "a" * 61 + ".io", "Vgpu.gpumgr.io"])
def test_the_extender_takes_only_a_driver_name_the_agent_takes(name: str) -> None:
    """One rule for both --dra-driver-name flags: an extender counting claims of a driver no agent can be."""
    from gpumgr.dra.config import driver_name_problem

    assert driver_name_problem(name) is not None
    proc = subprocess.run([sys.executable, "-m", "gpumgr.cli", "extender", "--insecure-serve-without-auth",
                           "--listen", "127.0.0.1:1", "--dra-driver-name", name], capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert proc.returncode == 2 and "--dra-driver-name must be a DNS subdomain with a dot" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
