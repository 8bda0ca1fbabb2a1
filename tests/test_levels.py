"""Link level spellings: only ASCII NV counts of a sane size are levels."""

import pytest

from gpumgr.topology import levels


@pytest.mark.parametrize("text", ["NV٣", "NV３", "NV" + "9" * 4, "NV0", "NV-1"])
def test_nv_levels_take_ascii_digits_of_at_most_three_places(text: str) -> None:
    with pytest.raises(ValueError, match="unknown link level"):
        levels.normalize(text)


def test_nv_levels_and_old_spellings_normalize() -> None:
    assert levels.normalize("nv12") == "NV12"
    assert levels.normalize("SOC") == "SYS"
