"""`gpumgr run` number flags take ASCII digits only (Python's int() would also take Unicode digits)."""

import pytest

from gpumgr.cli import main


@pytest.mark.parametrize("flags", [
    ["--memory-unit-mib", "٣"],
    ["--temp-unhealthy", "９５"],
    ["--health-ignore-xids", "13,٣١"],
    ["--metrics-addr", "127.0.0.1:٨٠"],
])
def test_unicode_digits_in_run_flags_are_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        rc = main(["run", "--node-name", "n1", "--simulate", "/nonexistent.yaml", *flags])
        raise SystemExit(rc)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert flags[0] in err
