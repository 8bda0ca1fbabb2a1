"""Pods of every kind through the real protocols: kubelet emulator → unix-socket gRPC → agent → API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpumgr.requests import podspec
from gpumgr.vdevice.limits import Limits
from tests.e2e.harness import env_of, mounts_of, sim_node

CORE, MEM = podspec.RESOURCE_CORE, podspec.RESOURCE_MEMORY


def limits_of(admitted, container: str) -> Limits:
    return Limits.parse((Path(mounts_of(admitted, container)["/etc/vcuda"]) / "limits").read_text())


def cards_of(node, admitted, container: str) -> list[int]:
    uuids = env_of(admitted, container)["NVIDIA_VISIBLE_DEVICES"].split(",")
    return sorted(node.inventory.by_uuid(u).index for u in uuids)


async def wait_annotated(node, name: str, key: str, timeout: float = 30.0) -> dict[str, str]:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        await node.agent.service.drain()
        ann = podspec.pod_annotations(node.pod(name))
        if key in ann:
            return ann
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {name} never got annotation {key}: {podspec.pod_annotations(node.pod(name))}")


async def test_whole_multi_card_and_fractional_pods_get_the_right_devices_and_limits():
    async with sim_node("baobab") as node:  # NVLink pairs inside two NUMA sockets
        multi = await node.run_pod("train", [("main", 200, 0)])
        whole = await node.run_pod("infer", [("main", 100, 0)])
        frac = await node.run_pod("notebook", [("main", 30, 16)], annotations={podspec.ANN_CORE_LIMIT: "60"})

        two = cards_of(node, multi, "main")
        assert len(two) == 2 and node.agent.state.topology.levels[two[0]][two[1]] == "NV4"
        resp = multi.container("main").responses[CORE]
        assert {d.host_path for d in resp.devices} >= {f"/dev/nvidia{node.inventory.gpus[c].minor}" for c in two}
        assert "/dev/nvidiactl" in {d.container_path for d in resp.devices}
        assert "LD_PRELOAD" not in env_of(multi, "main")  # whole cards run without the shim
        lim = limits_of(multi, "main")
        assert lim.core_limit == 0 and all(d.memory_limit_bytes == 0 for d in lim.devices)

        assert len(cards_of(node, whole, "main")) == 1 and not set(cards_of(node, whole, "main")) & set(two)

        env = env_of(frac, "main")
        assert env["LD_PRELOAD"].endswith("libvcuda.so") and env["VCUDA_SOCKET"] == "/etc/vcuda/vcuda.sock"
        lim = limits_of(frac, "main")
        pod = node.pod("notebook")
        assert lim.pod_uid == pod["metadata"]["uid"] and lim.container_name == "main"
        assert lim.core_limit == 30 and not lim.hard_limit and lim.core_ceiling == 60
        assert lim.devices[0].memory_limit_bytes == 16 * 256 << 20
        annotations = frac.container("main").responses[CORE].annotations
        assert annotations["tencent.com/vcuda-core"] == "30"
        assert annotations["tencent.com/vcuda-memory"] == str(16 * 256 << 20)

        ann = await wait_annotated(node, "notebook", podspec.ANN_ASSIGNED)
        card = cards_of(node, frac, "main")[0]
        assert ann["tencent.com/predicate-gpu-idx-0"] == str(node.inventory.gpus[card].minor)
        assert ann[podspec.ANN_ASSIGNED] == "true"
        ledger = node.agent.state.ledger
        assert ledger.cards[card].free_cores == 70 and ledger.cards[card].mode == "shared"


async def test_multi_container_pod_with_an_init_container():
    async with sim_node("dgx-a100") as node:
        admitted = await node.run_pod("multi", [("a", 20, 4), ("sidecar-no-gpu", 0, 0), ("b", 100, 0)],
                                      init_containers=[("setup", 10, 2)])
        a, b = limits_of(admitted, "a"), limits_of(admitted, "b")
        assert (a.container_name, a.core_limit, a.devices[0].memory_limit_bytes) == ("a", 20, 4 * 256 << 20)
        assert (b.container_name, b.core_limit) == ("b", 0)
        setup = limits_of(admitted, "setup")
        assert setup.container_name == "setup" and setup.core_limit == 10
        assert mounts_of(admitted, "a")["/etc/vcuda"] != mounts_of(admitted, "b")["/etc/vcuda"]
        ann = await wait_annotated(node, "multi", podspec.ANN_ASSIGNED)
        assert "tencent.com/predicate-gpu-idx-0" in ann and "tencent.com/predicate-gpu-idx-2" in ann
        assert "tencent.com/predicate-gpu-idx-1" not in ann


@pytest.mark.parametrize("kubelet_format", ["v2", "v1"])  # NUMA-keyed (>= 1.20) and the flat pre-1.20 checkpoint
async def test_two_identical_pending_pods_never_swap_limits(caplog, kubelet_format):
    """Both pods are pending when the kubelet admits the first, so Allocate may guess the wrong one; the
    limits written at PreStartContainer must still be each pod's own."""
    async with sim_node("dgx-a100", kubelet_checkpoint_format=kubelet_format) as node:
        p1 = node.create_pod("twin-1", [("main", 50, 8)], annotations={podspec.ANN_CORE_LIMIT: "80"})
        p2 = node.create_pod("twin-2", [("main", 50, 12)])
        # admit in the opposite order of their creation, so the oldest-first guess is wrong for both
        a2 = await node.admit(p2)
        a1 = await node.admit(p1)
        l1, l2 = limits_of(a1, "main"), limits_of(a2, "main")
        assert l1.pod_uid == p1["metadata"]["uid"] and l2.pod_uid == p2["metadata"]["uid"]
        assert l1.devices[0].memory_limit_bytes == 8 * 256 << 20 and l1.core_ceiling == 80 and not l1.hard_limit
        assert l2.devices[0].memory_limit_bytes == 12 * 256 << 20 and l2.hard_limit
        ledger = node.agent.state.ledger
        by_pod = {a.pod: a for a in ledger.allocations.values()}
        assert by_pod["twin-1"].memory_mib == 8 * 256 and by_pod["twin-2"].memory_mib == 12 * 256
        assert all(a.verified for a in ledger.allocations.values())
        assert "repaired before any limit was written" in caplog.text  # the wrong guess really happened


async def test_extender_recorded_cards_are_honoured():
    async with sim_node("p40") as node:
        minor = node.inventory.gpus[5].minor
        pod = node.create_pod("placed", [("main", 40, 4)], annotations={
            "tencent.com/predicate-gpu-idx-0": str(minor), podspec.ANN_PREDICATE_NODE: node.node_name,
            podspec.ANN_PREDICATE_TIME: "1700000000000000000", podspec.ANN_ASSIGNED: "false"})
        admitted = await node.admit(pod)
        assert cards_of(node, admitted, "main") == [5]


async def test_deleted_pods_free_their_cards_and_vdevice_directories():
    async with sim_node("gtx1080ti") as node:
        admitted = await node.run_pod("short", [("main", 30, 4)])
        vdir = Path(mounts_of(admitted, "main")["/etc/vcuda"])
        assert (vdir / "limits").exists() and (vdir / "vcuda.sock").exists()
        await node.delete_pod("short")
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        # the reconcile frees the ledger's allocation first and removes the directory after (awaiting between):
        # wait for both, not just the first
        while (node.agent.state.ledger.allocations or vdir.exists()) and loop.time() < end:
            await asyncio.sleep(0.05)
        assert not node.agent.state.ledger.allocations
        assert not vdir.exists()


async def test_a_pod_the_watch_saw_deleted_is_freed_without_listing_every_pod():
    """The watch's DELETED is final (a UID never comes back): reconcile frees on it, with no live list of the
    node's pods (which costs the agent a list of every pod after each deletion)."""
    async with sim_node("gtx1080ti") as node:
        for i in range(3):
            await node.run_pod(f"p{i}", [("main", 30, 4)])
        node.api.store.reset_request_counts()
        await node.delete_pod("p1")
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while any(a.pod == "p1" for a in node.agent.state.ledger.allocations.values()) and loop.time() < end:
            await asyncio.sleep(0.05)
        assert sorted(a.pod for a in node.agent.state.ledger.allocations.values()) == ["p0", "p2"]
        assert "list" not in node.api.store.request_counts("pods")


async def test_a_pod_that_does_not_fit_is_refused_and_changes_nothing():
    async with sim_node("gtx1080ti") as node:
        await node.run_pod("big", [("main", 200, 0)])
        before = node.agent.state.ledger.to_json()
        from gpumgr.sim.kubelet import AdmissionError

        with pytest.raises(AdmissionError):
            await node.run_pod("more", [("main", 30, 4)])
        assert node.agent.state.ledger.to_json() == before


async def test_cdi_names_and_vdevice_permissions():
    import os
    import stat

    async with sim_node("gtx1080ti", cdi=True) as node:
        admitted = await node.run_pod("cdi", [("main", 10, 1)])
        resp = admitted.container("main").responses[CORE]
        uuid = env_of(admitted, "main")["NVIDIA_VISIBLE_DEVICES"]
        assert [d.name for d in resp.cdi_devices] == [f"nvidia.com/gpu={uuid}"]
        assert {m.container_path: m.read_only for m in resp.mounts} == {
            "/usr/local/nvidia/lib64": True, "/etc/vcuda": True, "/usr/local/gpumgr": True}
        vdir = Path(mounts_of(admitted, "main")["/etc/vcuda"])
        mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
        # any user in the container can read the limits and reach the socket; nobody there can change them
        assert mode(vdir) == 0o755 and mode(vdir / "limits") == 0o644 and mode(vdir / "vcuda.sock") == 0o666
        shim = Path(mounts_of(admitted, "main")["/usr/local/gpumgr"]) / "lib64" / "libvcuda.so"
        assert shim.is_file()


async def test_fractional_pods_are_refused_while_the_shim_is_missing():
    from gpumgr.sim.kubelet import AdmissionError

    async with sim_node("gtx1080ti") as node:
        (Path(node.config.shim_dir) / "lib64" / "libvcuda.so").unlink()
        with pytest.raises(AdmissionError) as e:
            await node.run_pod("frac", [("main", 10, 1)])
        assert "the vCUDA shim is not installed" in str(e.value) + e.value.details
        await node.run_pod("whole", [("main", 100, 0)])  # whole cards need no shim
