"""The MIG instances a pod asks through the device plugins: summed over its containers (largest init container
when more), and a pod with more containers than are read is refused with the reason, not cut short."""

from __future__ import annotations

from typing import Any

import pytest

from gpumgr.requests.mig_ask import MAX_CONTAINERS, mig_asks

ONE = "nvidia.com/mig-1g.10gb"


def pod(n: int, init: int = 0) -> dict[str, Any]:
    def c(i: int) -> dict[str, Any]:
        return {"name": f"c{i}", "resources": {"limits": {ONE: "1"}}}

    return {"spec": {"containers": [c(i) for i in range(n)], "initContainers": [c(i) for i in range(init)]}}


def test_asks_are_summed_over_all_containers_up_to_the_bound():
    assert mig_asks(pod(3, init=1)) == {ONE: 3}
    assert mig_asks(pod(MAX_CONTAINERS, init=MAX_CONTAINERS)) == {ONE: MAX_CONTAINERS}


@pytest.mark.parametrize("field", ["containers", "initContainers"])
def test_more_containers_than_are_read_is_an_error_not_a_cut(field: str):
    too_many = pod(MAX_CONTAINERS + 1) if field == "containers" else pod(1, init=MAX_CONTAINERS + 1)
    with pytest.raises(ValueError, match=f"spec.{field} has {MAX_CONTAINERS + 1} entries, more than "
                                         f"{MAX_CONTAINERS}"):
        mig_asks(too_many)  # before: the first 1000 counted, the rest's asks silently left out
