"""`gpumgr_container_compute_limit_mode` on `/metric`, over real HTTP, from the status file the vCUDA shim writes in
the container's /dev/shm (read through /proc/<pid>/root; here a temporary proc root)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumgr.metrics import UsageReader, build_app, start_http
from gpumgr.metrics.shim_status import MAX_BYTES, ShimStatusReader
from gpumgr.node.cgroups import CgroupReader
from tests.metrics import cgroup_trees as ct
from tests.metrics.node import SimNode
from tests.metrics.scrape import absent, get, scrape, value

NAME = "gpumgr_container_compute_limit_mode"


def shm_of(proc: Path, pid: int) -> Path:
    d = proc / str(pid) / "root" / "dev" / "shm"
    d.mkdir(parents=True, exist_ok=True)
    return d


def status(cid: str, devices: list[tuple[int, str, str]]) -> str:
    lines = ["version=1", f"container_id={cid}"]
    for slot, uuid, mode in devices:
        lines += [f"device{slot}_uuid={uuid}", f"device{slot}_compute={mode}"]
    return "\n".join(lines) + "\n"


async def scrape_with(node: SimNode, proc: Path) -> tuple[dict, dict]:
    """/metric samples and the /usage document, from one agent whose shim-status reader looks under `proc`."""
    reader = UsageReader(node.state, node.backend, node.pods.get, CgroupReader(node.cgroup_root),
                         shim=ShimStatusReader(proc))
    server = await start_http(build_app(node.metrics, reader, ready=lambda: True), "127.0.0.1", 0)
    try:
        samples = await scrape(server)
        status, _, text = await get(server.url + "/usage")
        assert status == 200, text
        return samples, json.loads(text)
    finally:
        await server.close()


async def test_an_unthrottled_container_says_so_and_a_sibling_in_the_same_shm_does_not_leak_in(tmp_path, caplog):
    node = SimNode(tmp_path)
    proc = tmp_path / "proc"
    await node.place("train", "main", (0,), cores=50, memory_mib=4096, pids=[101])
    await node.place("train", "side", (1,), cores=30, memory_mib=1024, pids=[102])
    await node.place("infer", "srv", (2,), cores=30, memory_mib=1024, pids=[201])
    uuid0, uuid1 = node.inv.gpus[0].uuid, node.inv.gpus[1].uuid
    # main and side share the pod's /dev/shm: each file names its container
    shm = shm_of(proc, 101)
    (shm / "vcuda-v2-1a-2b.status").write_text(status(ct.container_id(1), [(0, uuid0, "unthrottled")]))
    (shm / "vcuda-v2-1a-2c.status").write_text(status(ct.container_id(2), [(0, uuid1, "device")]))
    (shm_of(proc, 102) / "vcuda-v2-1a-2c.status").write_text(status(ct.container_id(2), [(0, uuid1, "device")]))

    s, usage = await scrape_with(node, proc)

    main = {"pod_name": "train", "container_name": "main", "namespace": "ml", "node": "node-a"}
    side = {**main, "container_name": "side"}
    assert value(s, NAME, **main, uuid=uuid0, mode="unthrottled") == 1
    assert absent(s, NAME, **main, uuid=uuid1)
    assert value(s, NAME, **side, uuid=uuid1, mode="device") == 1
    assert absent(s, NAME, pod_name="infer")  # no file: the shim measures normally, nothing to say
    holders = {h["container"]: h for h in usage["holders"]}
    assert holders["main"]["compute_modes"] == {uuid0: "unthrottled"}
    assert holders["side"]["compute_modes"] == {uuid1: "device"} and holders["srv"]["compute_modes"] == {}
    warned = [r.getMessage() for r in caplog.records if "not enforced" in r.getMessage()]
    assert len(warned) == 1 and uuid0 in warned[0], warned


async def test_hostile_status_files_give_nothing(tmp_path):
    node = SimNode(tmp_path)
    proc = tmp_path / "proc"
    await node.place("evil", "main", (0,), cores=50, memory_mib=4096, pids=[301])
    uuid0 = node.inv.gpus[0].uuid
    shm = shm_of(proc, 301)
    secret = tmp_path / "secret"
    secret.write_text(status("", [(0, uuid0, "unthrottled")]))
    (shm / "vcuda-v2-1-1.status").symlink_to(secret)  # not followed
    (shm / "vcuda-v2-1-2.status").write_text(status("", [(0, "GPU-\"}x", "unthrottled"), (1, uuid0, "bogus")]))
    (shm / "vcuda-v2-1-3.status").write_text(status("", [(0, uuid0, "device")]) + "#" * MAX_BYTES)  # too big
    (shm / "vcuda-v2-1-4.status").mkdir()

    s, usage = await scrape_with(node, proc)

    assert absent(s, NAME, pod_name="evil")
    assert usage["holders"][0]["compute_modes"] == {}
    assert value(s, "gpumgr_container_processes", pod_name="evil") == 1


async def test_an_absolute_symlink_inside_the_container_root_is_not_followed_out_of_it(tmp_path):
    # /proc/<pid>/root/dev -> /elsewhere: an absolute link resolves against the agent's root, not the container's,
    # so the agent would read a file the container does not own. No symlink is followed at any step.
    node = SimNode(tmp_path)
    proc = tmp_path / "proc"
    await node.place("evil", "main", (0,), cores=50, memory_mib=4096, pids=[401, 402])
    uuid0 = node.inv.gpus[0].uuid
    outside = tmp_path / "agent-root" / "dev"
    (outside / "shm").mkdir(parents=True)
    (outside / "shm" / "vcuda-v2-1-1.status").write_text(status("", [(0, uuid0, "unthrottled")]))
    root401 = proc / "401" / "root"
    root401.mkdir(parents=True)
    (root401 / "dev").symlink_to(outside)  # link at `dev`
    root402 = proc / "402" / "root" / "dev"
    root402.mkdir(parents=True)
    (root402 / "shm").symlink_to(outside / "shm")  # link at `dev/shm`

    s, usage = await scrape_with(node, proc)

    assert absent(s, NAME, pod_name="evil")
    assert usage["holders"][0]["compute_modes"] == {}


def test_the_shared_dir_is_found_when_every_step_is_a_real_directory(tmp_path):
    proc = tmp_path / "proc"
    shm_of(proc, 7).joinpath("vcuda-v2-1-1.status").write_text(status("", [(0, "GPU-12345678-aaaa", "device")]))
    assert ShimStatusReader(proc).modes([7], "") == {"GPU-12345678-aaaa": "device"}
    with pytest.raises(ValueError, match="shared_dir"):
        ShimStatusReader(proc, shared_dir="dev/../dev/shm")
