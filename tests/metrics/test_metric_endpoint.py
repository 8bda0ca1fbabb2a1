"""`/metric` over real HTTP, parsed with prometheus-client's parser, values checked."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.metrics.node import GIB, MIB, MODEL, RecordingBackend, SimNode
from tests.metrics.scrape import absent, get, scrape, serving, value


@pytest.fixture
def node(tmp_path):
    return SimNode(tmp_path)


def who(pod: str, container: str, namespace: str = "ml") -> dict[str, str]:
    return {"pod_name": pod, "container_name": container, "namespace": namespace, "node": "node-a"}


async def test_two_containers_sharing_a_card_each_see_only_their_own_processes(node):
    await node.place("train", "main", (0,), cores=30, memory_mib=4096, pids=[101, 102])
    await node.place("infer", "srv", (0,), cores=50, memory_mib=2048, pids=[201])
    node.sim.set_process(0, 101, used_memory_bytes=1 * GIB, sm_util=20)
    node.sim.set_process(0, 102, used_memory_bytes=512 * MIB, sm_util=5)
    node.sim.set_process(0, 201, used_memory_bytes=2 * GIB, sm_util=40)
    node.sim.set_process(0, 999, used_memory_bytes=256 * MIB, sm_util=10)  # not in any GPU container
    node.sim.set_process(1, 101, used_memory_bytes=GIB, sm_util=50)  # on a card train/main does not hold

    async with serving(node) as server:
        s = await scrape(server)

    a, b = who("train", "main"), who("infer", "srv")
    assert value(s, "container_gpu_utilization", **a, gpu="gpu0") == 25
    assert value(s, "container_gpu_utilization", **a, gpu="total") == 25
    assert value(s, "container_gpu_memory_total", **a, gpu_memory="gpu0") == 1536
    assert value(s, "container_gpu_memory_total", **a, gpu_memory="total") == 1536
    assert absent(s, "container_gpu_utilization", **a, gpu="gpu1")
    assert value(s, "container_gpu_utilization", **b, gpu="total") == 40
    assert value(s, "container_gpu_memory_total", **b, gpu_memory="gpu0") == 2048
    assert value(s, "container_request_gpu_utilization", **a, req_of_gpu="total") == pytest.approx(0.3)
    assert value(s, "container_request_gpu_utilization", **b, req_of_gpu="total") == pytest.approx(0.5)
    assert value(s, "container_request_gpu_memory", **a, req_of_gpu_memory="total") == 4096
    assert value(s, "container_request_gpu_memory", **b, req_of_gpu_memory="total") == 2048
    assert value(s, "gpumgr_container_processes", **a) == 2

    card0 = {"gpu": "gpu0", "uuid": node.inv.gpus[0].uuid, "model": MODEL}
    assert value(s, "gpumgr_gpu_allocated_cores", **card0) == 80
    assert value(s, "gpumgr_gpu_allocated_memory_bytes", **card0) == 6144 * MIB
    assert value(s, "gpumgr_gpu_used_memory_bytes", **card0) == 1 * GIB + 512 * MIB + 2 * GIB + 256 * MIB
    assert value(s, "gpumgr_gpu_utilization_percent", **card0) == 75
    assert value(s, "gpumgr_gpu_holders", **card0) == 2
    assert value(s, "gpumgr_gpu_holders", gpu="gpu1") == 0
    assert value(s, "gpumgr_gpu_memory_bytes", gpu="gpu3") == 16384 * MIB
    assert value(s, "gpumgr_gpu_temperature_celsius", gpu="gpu0") == 40
    assert value(s, "gpumgr_gpu_healthy", **card0) == 1


async def test_a_pid_with_several_samples_is_counted_once(node):
    await node.place("train", "main", (2,), cores=40, memory_mib=1024, pids=[300, 301])
    node.sim.set_process(2, 300, used_memory_bytes=GIB, sm_util=30)
    node.sim.set_process(2, 301, used_memory_bytes=GIB, sm_util=10)
    node.backend = RecordingBackend(node.sim)
    node.backend.duplicate = True  # every process reported twice (e.g. compute and graphics lists)

    async with serving(node) as server:
        s = await scrape(server)

    a = who("train", "main")
    assert value(s, "container_gpu_utilization", **a, gpu="gpu2") == 40
    assert value(s, "container_gpu_memory_total", **a, gpu_memory="total") == 2048


async def test_whole_cards_request_the_cards_memory(node):
    await node.place("big", "main", (2, 3), cores=200, memory_mib=0, pids=[400], qos="guaranteed")
    node.sim.set_process(2, 400, used_memory_bytes=3 * GIB, sm_util=90)
    node.sim.set_process(3, 400, used_memory_bytes=GIB, sm_util=70)

    async with serving(node) as server:
        s = await scrape(server)

    a = who("big", "main")
    assert value(s, "container_request_gpu_utilization", **a) == 2
    assert value(s, "container_request_gpu_memory", **a) == 2 * 16384
    assert value(s, "container_gpu_utilization", **a, gpu="gpu2") == 90
    assert value(s, "container_gpu_utilization", **a, gpu="gpu3") == 70
    assert value(s, "container_gpu_utilization", **a, gpu="total") == 160
    assert value(s, "container_gpu_memory_total", **a, gpu_memory="total") == 4096
    for g in ("gpu2", "gpu3"):
        assert value(s, "gpumgr_gpu_allocated_cores", gpu=g) == 100
        assert value(s, "gpumgr_gpu_allocated_memory_bytes", gpu=g) == 16384 * MIB
    assert value(s, "gpumgr_gpu_allocated_cores", gpu="gpu0") == 0


async def test_health_transitions_and_xid_errors(node):
    async with serving(node) as server:
        before = await scrape(server)
        assert value(before, "gpumgr_gpu_healthy", gpu="gpu1") == 1
        assert value(before, "gpumgr_gpu_xid_errors_total", gpu="gpu1") == 0

        assert await node.state.set_reason(1, "xid 79", True)
        node.metrics.health_transition(1, False, "xid: 79 GPU has fallen off the bus")
        node.metrics.xid_error(1, 79)
        node.metrics.xid_error(1, 13)
        sick = await scrape(server)

        await node.state.set_reason(1, "xid 79", False)
        node.metrics.health_transition(1, True, "xid")
        well = await scrape(server)

    assert value(sick, "gpumgr_gpu_healthy", gpu="gpu1", uuid=node.inv.gpus[1].uuid) == 0
    assert value(sick, "gpumgr_gpu_healthy", gpu="gpu0") == 1
    assert value(sick, "gpumgr_gpu_xid_errors_total", gpu="gpu1") == 2
    assert value(sick, "gpumgr_gpu_xid_errors_total", gpu="gpu0") == 0
    assert value(sick, "gpumgr_gpu_health_transitions_total", gpu="gpu1", to="unhealthy", reason="xid") == 1
    assert value(well, "gpumgr_gpu_healthy", gpu="gpu1") == 1
    assert value(well, "gpumgr_gpu_health_transitions_total", gpu="gpu1", to="healthy", reason="xid") == 1
    assert value(well, "gpumgr_gpu_xid_errors_total", gpu="gpu1") == 2


async def test_agent_event_counters(node):
    m = node.metrics
    m.observe_allocate(0.003, ok=True)
    m.observe_allocate(0.004, ok=True)
    m.observe_allocate(0.2, ok=False, reason="no fit: 3 cards asked, 2 free")
    m.observe_allocate(0.3, ok=False, reason="no_fit")
    m.observe_allocate(0.01, ok=False, reason="unhealthy")
    m.reregistration("tencent.com/vcuda-core")
    m.reregistration("tencent.com/vcuda-core")
    m.reregistration("tencent.com/vcuda-memory")
    m.vdevice_registration()
    await node.place("a", "c", (0,), cores=10, memory_mib=256, pids=[5])
    await node.place("b", "c", (0,), cores=10, memory_mib=256, pids=[6])  # two checkpoint writes by the state
    m.checkpoint_write(True)
    m.checkpoint_write(False)

    async with serving(node) as server:
        s = await scrape(server)

    assert value(s, "gpumgr_allocate_duration_seconds_count") == 5
    assert value(s, "gpumgr_allocate_duration_seconds_sum") == pytest.approx(0.517)
    assert value(s, "gpumgr_allocate_duration_seconds_bucket", le="0.005") == 2
    assert value(s, "gpumgr_allocate_duration_seconds_bucket", le="+Inf") == 5
    assert value(s, "gpumgr_allocations_total") == 2
    assert value(s, "gpumgr_allocation_failures_total", reason="no_fit") == 2
    assert value(s, "gpumgr_allocation_failures_total", reason="unhealthy") == 1
    assert value(s, "gpumgr_kubelet_reregistrations_total", resource="tencent.com/vcuda-core") == 2
    assert value(s, "gpumgr_kubelet_reregistrations_total", resource="tencent.com/vcuda-memory") == 1
    assert value(s, "gpumgr_vdevice_registrations_total") == 1
    assert value(s, "gpumgr_checkpoint_writes_total") == 3
    assert value(s, "gpumgr_checkpoint_write_failures_total") == 1
    assert value(s, "gpumgr_scrape_collect_seconds") >= 0


async def test_a_pod_recreated_under_the_same_name_gives_one_series_set(node):
    """A StatefulSet pod replaced while the old one still holds its card: the newest holder's figures only."""
    await node.place("db-0", "main", (0,), cores=20, memory_mib=1024, pids=[700], created=1700000000)
    node.uids.pop("db-0")  # same name, new pod UID
    await node.place("db-0", "main", (1,), cores=40, memory_mib=2048, pids=[800], created=1700000500)
    node.sim.set_process(1, 800, used_memory_bytes=GIB, sm_util=33)

    async with serving(node) as server:
        s = await scrape(server)  # the helper fails on any duplicate series

    a = who("db-0", "main")
    assert value(s, "container_request_gpu_utilization", **a) == pytest.approx(0.4)
    assert value(s, "container_gpu_utilization", **a, gpu="total") == 33
    assert absent(s, "container_gpu_utilization", **a, gpu="gpu0")
    assert value(s, "gpumgr_gpu_holders", gpu="gpu0") == 1


async def test_container_not_running_has_requests_but_no_usage(node):
    await node.place("pending", "main", (1,), cores=20, memory_mib=512, pids=[], running=False)
    await node.place("ghost", "main", (1,), cores=20, memory_mib=512, pids=[77])
    node.sim.set_process(1, 77, used_memory_bytes=GIB, sm_util=10)
    node.pods.pop(node.uids["ghost"])  # the API no longer knows the pod

    async with serving(node) as server:
        s = await scrape(server)

    for pod in ("pending", "ghost"):
        a = who(pod, "main")
        assert value(s, "container_request_gpu_utilization", **a) == pytest.approx(0.2)
        assert value(s, "container_request_gpu_memory", **a) == 512
        assert value(s, "container_gpu_memory_total", **a, gpu_memory="total") == 0
        assert value(s, "gpumgr_container_processes", **a) == 0


async def test_a_card_nvml_cannot_read_does_not_fail_the_scrape(node):
    await node.place("train", "main", (3,), cores=50, memory_mib=1024, pids=[500])
    node.sim.set_process(3, 500, used_memory_bytes=GIB, sm_util=10)
    node.sim.set_process(2, 9, used_memory_bytes=GIB, sm_util=10)
    node.backend = RecordingBackend(node.sim)
    node.backend.failing = {3}

    async with serving(node) as server:
        s = await scrape(server)

    assert value(s, "gpumgr_gpu_status_up", gpu="gpu3") == 0
    assert value(s, "gpumgr_gpu_status_up", gpu="gpu2") == 1
    assert absent(s, "gpumgr_gpu_used_memory_bytes", gpu="gpu3")
    assert value(s, "gpumgr_gpu_used_memory_bytes", gpu="gpu2") == GIB
    assert value(s, "gpumgr_gpu_allocated_cores", gpu="gpu3") == 50
    a = who("train", "main")
    assert absent(s, "container_gpu_utilization", **a, gpu="gpu3")
    assert value(s, "container_request_gpu_utilization", **a) == pytest.approx(0.5)


async def test_the_scrape_reads_the_node_off_the_event_loop(node):
    """While NVML is stuck inside a scrape, the event loop still answers other requests."""
    await node.place("train", "main", (0,), cores=50, memory_mib=1024, pids=[1])
    backend = RecordingBackend(node.sim)
    gate = backend.gate = threading.Event()
    node.backend = backend
    async with serving(node) as server:
        scrape_task = asyncio.create_task(scrape(server))
        assert await asyncio.to_thread(backend.entered.wait, 10)
        status, _, _ = await get(server.url + "/healthz")  # answered while the scrape is blocked in NVML
        assert status == 200
        assert not scrape_task.done()
        gate.set()
        s = await scrape_task
    assert threading.get_ident() not in backend.threads
    assert value(s, "gpumgr_gpu_allocated_cores", gpu="gpu0") == 50


async def test_metrics_alias_content_type_and_independent_registries(tmp_path):
    one, two = SimNode(tmp_path / "1"), SimNode(tmp_path / "2")
    one.metrics.vdevice_registration()
    async with serving(one) as s1, serving(two) as s2:
        status, ctype, _ = await get(s1.url + "/metric")
        assert status == 200 and "version=0.0.4" in ctype
        a = await scrape(s1, "/metrics")
        b = await scrape(s2)
    assert value(a, "gpumgr_vdevice_registrations_total") == 1
    assert value(b, "gpumgr_vdevice_registrations_total") == 0


async def test_a_card_that_fell_off_the_bus_gives_no_usage_figure_rather_than_a_false_one(node):
    await node.place("train", "main", (0,), cores=30, memory_mib=4096, pids=[101])
    node.sim.set_process(0, 101, used_memory_bytes=GIB, sm_util=40)
    node.sim.fall_off_bus(0)
    async with serving(node) as server:
        s = await scrape(server)
    a = who("train", "main")
    assert absent(s, "container_gpu_utilization", **a, gpu="gpu0")
    assert absent(s, "container_gpu_memory_total", **a, gpu_memory="gpu0")
    assert value(s, "container_request_gpu_utilization", **a, req_of_gpu="total") == pytest.approx(0.3)


async def test_cordon_gauge_follows_the_node_annotation_and_holders_stay(node):
    from contextlib import AsyncExitStack

    from gpumgr.metrics import AgentMetrics, UsageReader, build_app, start_http
    from gpumgr.node.cgroups import CgroupReader
    from gpumgr.requests.choices import ANN_CORDON, CordonWatch

    await node.place("old", "main", (1,), cores=30, memory_mib=1024, pids=[101])
    watch = CordonWatch(node.inv.gpus)
    reader = UsageReader(node.state, node.backend, node.pods.get, CgroupReader(node.cgroup_root), cordon=watch)
    async with AsyncExitStack() as stack:
        server = await start_http(build_app(node.metrics, reader), "127.0.0.1", 0)
        stack.push_async_callback(server.close)
        watch.update({"metadata": {"annotations": {ANN_CORDON: f"1,{node.inv.gpus[3].uuid}"}}})
        s = await scrape(server)
        assert [value(s, "gpumgr_gpu_cordoned", gpu=f"gpu{i}") for i in range(4)] == [0, 1, 0, 1]
        assert value(s, "gpumgr_gpu_cordoned", gpu="gpu1", uuid=node.inv.gpus[1].uuid) == 1
        assert value(s, "gpumgr_gpu_holders", gpu="gpu1") == 1  # the pod on the cordoned card keeps its share
        watch.update({"metadata": {"annotations": {ANN_CORDON: "7"}}})  # not a card: every card, and why
        s = await scrape(server)
        assert [value(s, "gpumgr_gpu_cordoned", gpu=f"gpu{i}") for i in range(4)] == [1, 1, 1, 1]
        _, _, body = await get(server.url + "/usage")
        assert ANN_CORDON in body and "card 7" in body
        watch.update({"metadata": {"annotations": {}}})
        s = await scrape(server)
        assert [value(s, "gpumgr_gpu_cordoned", gpu=f"gpu{i}") for i in range(4)] == [0, 0, 0, 0]
    node.metrics = AgentMetrics()
    async with serving(node) as plain:  # a reader that does not follow the cordon says nothing about it
        assert absent(await scrape(plain), "gpumgr_gpu_cordoned")
