"""The scale bench's end-of-path audit (tests/bench/scale/audit.py) sums every card from API objects: it must see
an over-committed card whichever way it is held, say when a pod and a claim share it, and judge multi-card links."""

from __future__ import annotations

from typing import Any

from gpumgr.requests import podspec
from tests.bench.scale import fleet
from tests.bench.scale.audit import audit

NODES = {n.name: n for n in fleet.plan(10)}  # gpu-00000: V100 cube mesh; gpu-00001: A6000 pairs; gpu-00009: card 7 bad


def vcuda_pod(node: str, minors: str, cores: int, units: int = 0) -> dict[str, Any]:
    limits = {podspec.RESOURCE_CORE: str(cores)}
    if units:
        limits[podspec.RESOURCE_MEMORY] = str(units)
    return {"metadata": {"annotations": {f"{podspec.ANN_PREDICATE_IDX}0": minors}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]}}


def claim(node: str, *devices: tuple[int, dict[str, str] | None]) -> dict[str, Any]:
    results = [{"driver": fleet.DRIVER, "pool": node, "device": f"gpu-{i}",
                **({"consumedCapacity": used} if used else {})} for i, used in devices]
    return {"status": {"allocation": {"devices": {"results": results}}}}


def test_shares_that_fit_are_not_over_committed() -> None:
    pods = [vcuda_pod("gpu-00000", "0", 50, 40), vcuda_pod("gpu-00000", "0", 50, 40)]
    found = audit(NODES, pods, [claim("gpu-00000", (1, {"cores": "30", "memory": "4Gi"}))])
    assert found.overcommitted == [] and found.mixed == 0


def test_two_pods_over_one_card() -> None:
    found = audit(NODES, [vcuda_pod("gpu-00000", "2", 60), vcuda_pod("gpu-00000", "2", 50)], [])
    assert [line.split(":")[0] for line in found.overcommitted] == ["gpu-00000/gpu-2"]
    assert found.mixed == 0


def test_a_whole_claim_and_a_share_on_one_card_is_the_race() -> None:
    found = audit(NODES, [vcuda_pod("gpu-00001", "3", 10, 4)], [claim("gpu-00001", (3, None))])
    assert len(found.overcommitted) == 1 and "(claim+pod)" in found.overcommitted[0]
    assert found.mixed == 1
    assert found.race_cards == {3: 1} and found.race_kinds == {"claim whole + pod share": 1}


def test_the_race_is_counted_by_device_and_by_holders() -> None:
    pods = [vcuda_pod("gpu-00001", "0", 100), vcuda_pod("gpu-00002", "0", 60, 4), vcuda_pod("gpu-00003", "5", 70, 4)]
    claims = [claim("gpu-00001", (0, {"cores": "30", "memory": "4Gi"})),
              claim("gpu-00002", (0, {"cores": "50", "memory": "4Gi"})),
              claim("gpu-00003", (5, {"cores": "40", "memory": "4Gi"}))]
    found = audit(NODES, pods, claims)
    assert found.mixed == 3
    assert found.race_cards == {0: 2, 5: 1}
    assert found.race_kinds == {"claim share + pod share": 2, "claim share + pod whole": 1}


def test_memory_over_the_card_counts_too() -> None:
    units = 32768 // 256  # the V100's whole memory, twice
    found = audit(NODES, [vcuda_pod("gpu-00000", "4", 10, units), vcuda_pod("gpu-00000", "4", 10, units)], [])
    assert len(found.overcommitted) == 1


def test_an_unhealthy_card_in_use_is_counted() -> None:
    found = audit(NODES, [vcuda_pod("gpu-00009", "7", 10)], [])
    assert [line.split(":")[0] for line in found.overcommitted] == ["gpu-00009/gpu-7"]


def test_too_many_whole_cards_on_a_node() -> None:
    pod = {"metadata": {}, "spec": {"nodeName": "gpu-00009", "containers": [
        {"name": "c", "resources": {"limits": {fleet.BASELINE_RESOURCE: "8"}}}]}}
    found = audit(NODES, [pod], [])
    assert found.overcommitted == ["gpu-00009: 8 example.com/gpu of 7"]


def test_multi_card_links_against_the_best_of_the_board() -> None:
    # A6000 board: 0-1 is an NVLink pair, 0-2 only PCIe; V100 cube mesh: 0-5 is SYS, 0-3 NV2
    pods = [vcuda_pod("gpu-00001", "0,1", 200), vcuda_pod("gpu-00001", "2,4", 200)]
    claims = [claim("gpu-00000", (0, None), (3, None)), claim("gpu-00000", (1, None), (4, None))]
    found = audit(NODES, pods, claims)
    assert (found.multi_card, found.multi_card_best) == (4, 2)


def test_ratios_compare_paths_with_the_same_arrivals() -> None:
    from tests.bench.bench_scale import Row, table

    rows = [Row(n=10, path="a", pods=4, bound=4, pods_per_s=40.0, qps="200/400"),
            Row(n=10, path="b", pods=4, bound=4, pods_per_s=20.0, qps="200/400"),
            Row(n=10, path="a", pods=2, bound=2, rate=10.0, pods_per_s=10.0, qps="200/400"),
            Row(n=10, path="b", pods=2, bound=2, rate=10.0, pods_per_s=5.0, qps="200/400")]
    lines = table(rows).splitlines()[2:]
    assert "burst" in lines[1] and "20.0 (0.50)" in lines[1]
    assert "paced 10/s" in lines[3] and "5.0 (0.50)" in lines[3]
    assert all("200/400" in line for line in lines)


def test_every_scheduler_gets_the_charts_client_rate_unless_told() -> None:
    from tests.bench.bench_scale import client_rate

    assert client_rate(0) == {"qps": 200, "burst": 400}
    assert client_rate(50) == {"qps": 50, "burst": 100}


def test_the_paced_round_is_a_share_of_path_a_in_burst() -> None:
    from tests.bench.bench_scale import Row, paced_rate

    rows = [Row(n=10, path="b", pods=4, bound=4, pods_per_s=20.0),
            Row(n=10, path="a", pods=4, bound=4, pods_per_s=41.0)]
    assert paced_rate(rows, 0.25) == 10.2
    assert paced_rate(rows, 0.0) == 0.0
    assert paced_rate(rows[:1], 0.25) == 0.0  # no path a: no paced round
