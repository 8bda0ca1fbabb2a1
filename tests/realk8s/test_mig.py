"""MIG on a real cluster: a node whose agent runs on the fake NVML with two H100s in MIG mode (card 0 with a static
layout of 1g.10gb instances for the device plugins, card 1 empty for DRA). A pod asking `nvidia.com/mig-1g.10gb` is
scheduled by kube-scheduler, admitted by the real kubelet through the agent's per-profile device plugin, and
created with the instance's devices; DRA claims of two profiles are allocated by kube-scheduler on the agent's
partitionable devices without overlapping placements, prepared (the instances made) and destroyed when the pods
and claims are deleted."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpumgr.devices.types import GPU, Inventory
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.requests.claim_results import mig_device
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.realk8s import workloads as w
from tests.realk8s.cluster import Node
from tests.realk8s.conftest import Env
from tests.realk8s.install import MIG_CLASS
from tests.realk8s.procs import wait_for

pytestmark = pytest.mark.timeout(900)
MIG_NODE = "mig-node"
DRIVER = "vgpu.gpumgr.io"
MIG_1G = "nvidia.com/mig-1g.10gb"
LAYOUTS = {"dp-on-card-0": {"0": ["1g.10gb", "1g.10gb", "1g.10gb"]}}
SIZES = {9: 4, 14: 2}  # H100 profile id -> memory slices: 3g.40gb, 2g.20gb
INV = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i:08d}-realk8s-mig", minor=i, name="NVIDIA H100 80GB HBM3",
                               memory_mib=81920) for i in range(2)), levels=(("X", "NV18"), ("NV18", "X")))


def mig_agent_args(env: Env, node: Node, fake: FakeNvmlNode, layouts: Path) -> list[str]:
    """The chart's agent arguments for this node (install.py), on the fake NVML instead of the simulated backend,
    with the MIG flags the chart renders for agent.mig.layout/layouts (tests/chart/test_chart_mig.py)."""
    args = [a for a in env.gpumgr.agent_args(node, env.spec) if not a.startswith("--simulate=")]
    return [*args, f"--nvml-lib={nvml_node.library()}", f"--mig-minors={fake.mig_minors}",
            f"--sysfs-root={node.dir / 'agent' / 'sys'}", f"--mig-layouts-file={layouts}",
            "--mig-layout=dp-on-card-0", "--mig-resource-prefix=nvidia.com/mig-", "--mig-strategy=mixed"]


@contextmanager
def running_mig_node(env: Env, name: str, extra_args: tuple[str, ...] = ()) -> Iterator[Node]:
    """A node whose agent runs on the fake NVML with two H100s in MIG mode and the layout `dp-on-card-0`
    (`extra_args`: more agent flags); afterwards its pods and claims are deleted and the node removed."""
    nvml_node.build()
    node = env.cluster.add_node(name, labels={"nvidia.com/gpu.present": "true"})
    fake = FakeNvmlNode(node.dir / "nvml", INV, mig={0: "h100-80", 1: "h100-80"}, mig_on=(0, 1)).write()
    layouts = node.dir / "mig-layouts.json"
    layouts.write_text(json.dumps(LAYOUTS))
    args = [*mig_agent_args(env, node, fake, layouts), *extra_args]
    proc = node.run_in_namespace(f"{name}-agent", [sys.executable, "-m", "gpumgr.cli", *args],
                                 env={**os.environ, **fake.env()}, restart=True)
    env.gpumgr.agents[name] = proc
    core = env.core()
    w.ensure_namespace(core)
    yield node
    w.delete_all(core)
    _delete_claims(env)
    node.stop()
    del env.cluster.nodes[name]
    core.delete_node(name)
    wait_for(f"node {name} gone", lambda: name not in [n.metadata.name for n in core.list_node().items], 60)
    del env.gpumgr.agents[name]


@pytest.fixture
def mig_node(realk8s: Env) -> Iterator[Node]:
    with running_mig_node(realk8s, MIG_NODE) as node:
        yield node


def run_one_mig_pod(env: Env, node: Node, resource: str, capacity: int, pod_name: str) -> tuple[Any, dict[str, Any]]:
    """Once the node's capacity shows `capacity` of `resource`, a pod asking one of them (container `main`):
    it runs there, created with an instance of card 0 (its MIG UUID in NVIDIA_VISIBLE_DEVICES; the parent card,
    the instance's GPU- and compute-instance capability nodes, and nvidiactl). The pod and its CreateContainer
    record."""
    core = env.core()
    proc = env.gpumgr.agents[node.name]
    wait_for(f"{capacity} {resource} in node {node.name}'s capacity", lambda: (
        core.read_node(node.name).status.capacity or {}).get(resource) == str(capacity), 180, interval_s=0.5,
        procs=(proc,))
    w.create(core, w.plain_pod(pod_name, containers=[{"name": "main", "image": w.IMAGE,
                                                      "resources": {"limits": {resource: "1"}}}]))
    pod = w.wait_running(core, pod_name)
    assert pod.spec.node_name == node.name
    record = w.record_for(node, pod, "main")
    assert record["envs"]["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-"), record["envs"]
    devices = [d["hostPath"] for d in record["devices"]]
    assert devices[0] == "/dev/nvidia0" and "/dev/nvidiactl" in devices, devices
    assert len([d for d in devices if d.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2, devices
    return pod, record


def test_pod_asking_a_mig_profile_runs_with_the_instances_devices(realk8s: Env, mig_node: Node) -> None:
    _, record = run_one_mig_pod(realk8s, mig_node, MIG_1G, 3, "mig-1g")
    mig_uuid = record["envs"]["NVIDIA_VISIBLE_DEVICES"]
    slots = _slots(mig_node)
    held = [s for s in slots if s.uuid == mig_uuid]
    assert len(held) == 1 and held[0].card == 0 and held[0].origin == "layout", slots


def test_dra_claims_of_two_profiles_do_not_overlap_and_are_destroyed(realk8s: Env, mig_node: Node) -> None:
    from kubernetes import client as k

    core = realk8s.core()
    custom = k.CustomObjectsApi(realk8s.cluster.client())
    proc = realk8s.gpumgr.agents[MIG_NODE]
    wait_for("the MIG node's partitionable devices", lambda: _mig_devices(custom), 180, interval_s=0.5,
             procs=(proc,))
    for name, profile in (("three", "3g.40gb"), ("two", "2g.20gb")):
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims",
                                               _claim(name, profile))
        w.create(core, _claim_pod(f"dra-{name}", name))
    pods = {name: w.wait_running(core, f"dra-{name}", timeout_s=180) for name in ("three", "two")}
    placed = {}
    for name, pod in pods.items():
        claim = custom.get_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims", name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == MIG_NODE and pod.spec.node_name == MIG_NODE
        where = mig_device(result["device"])
        assert where is not None, result
        card, profile_id, start = where
        placed[name] = (card, start, start + SIZES[profile_id])
        record = w.record_for(mig_node, pod, "cuda")
        assert len(record["cdiDevices"]) == 1, record
    (c1, a1, b1), (c2, a2, b2) = placed.values()
    assert c1 != c2 or b1 <= a2 or b2 <= a1, placed  # never two instances on the same memory slices
    # the layout's instances on card 0 (memory slices 0-2) are not offered: no claim lands on them
    assert all(card != 0 or start >= 3 for card, start, _end in placed.values()), placed
    made = {(s.card, s.start) for s in _slots(mig_node) if s.origin == "claim"}
    assert made == {(c, a) for c, a, _b in placed.values()}, made

    w.delete_all(core)
    _delete_claims(realk8s)
    wait_for("the claims' instances destroyed", lambda: not [s for s in _slots(mig_node) if s.origin == "claim"],
             120, procs=(proc,))


def _mig_devices(custom: Any) -> list[str] | None:
    slices = custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    names = [d["name"] for s in slices if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == MIG_NODE
             for d in s["spec"].get("devices") or [] if (d.get("attributes") or {}).get("type", {}).get("string")
             == "mig"]
    return names or None


def _claim(name: str, profile: str) -> dict[str, Any]:
    expression = (f'device.attributes["{DRIVER}"].type == "mig" && '
                  f'device.attributes["{DRIVER}"].profile == "{profile}"')
    exactly = {"deviceClassName": MIG_CLASS, "allocationMode": "ExactCount", "count": 1,
               "selectors": [{"cel": {"expression": expression}}]}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": w.NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}}


def _claim_pod(name: str, claim_name: str) -> dict[str, Any]:
    pod = w.plain_pod(name, containers=[{"name": "cuda", "image": w.IMAGE, "resources": {"claims": [{"name": "mig"}]}}])
    pod["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimName": claim_name}]
    return pod


def _delete_claims(env: Env) -> None:
    from kubernetes import client as k

    custom = k.CustomObjectsApi(env.cluster.client())
    custom.delete_collection_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims")
    wait_for("every claim gone", lambda: not custom.list_namespaced_custom_object(
        "resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims")["items"], 60)


def _slots(node: Node) -> list[Any]:
    return list(CheckpointStore(node.dir / "agent" / "checkpoint").load().snapshot.ledger.slots.values())


def test_dra_shares_of_one_mig_instance_get_their_memory_limits(realk8s: Env, mig_node: Node) -> None:
    """Two claims each asking a share (4 GiB, 50 cores) of a 3g.40gb device: kube-scheduler allocates both to the
    same multi-allocatable MIG device (its counters consumed once), each with a shareID and its consumedCapacity;
    the agent makes one instance; each container's CDI device carries the MIG UUID and the shim, and its limits
    file caps it at 4 GiB on that instance; deleting both destroys the instance."""
    from kubernetes import client as k

    core = realk8s.core()
    custom = k.CustomObjectsApi(realk8s.cluster.client())
    proc = realk8s.gpumgr.agents[MIG_NODE]
    wait_for("the MIG node's partitionable devices", lambda: _mig_devices(custom), 180, interval_s=0.5,
             procs=(proc,))
    share = {"memory": "4Gi", "cores": "50"}
    for name in ("share-a", "share-b"):
        claim = _claim(name, "3g.40gb")
        claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": share}
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims", claim)
        w.create(core, _claim_pod(f"dra-{name}", name))
    pods = {name: w.wait_running(core, f"dra-{name}", timeout_s=180) for name in ("share-a", "share-b")}
    results = {}
    for name in pods:
        claim = custom.get_namespaced_custom_object("resource.k8s.io", "v1", w.NAMESPACE, "resourceclaims", name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == MIG_NODE and result.get("shareID"), result
        assert result["consumedCapacity"] == share, result
        results[name] = (result, claim["metadata"]["uid"])
    (ra, _), (rb, _) = results.values()
    assert ra["device"] == rb["device"] and ra["shareID"] != rb["shareID"], (ra, rb)
    where = mig_device(ra["device"])
    assert where is not None and where[1] == 9, ra  # 3g.40gb
    card, _, start = where
    made = [s for s in _slots(mig_node) if s.origin == "claim"]
    assert [(s.card, s.start) for s in made] == [(card, start)], made  # one instance for both shares
    mig_uuid = made[0].uuid
    agent_dir = mig_node.dir / "agent"
    for name, pod in pods.items():
        _, uid = results[name]
        record = w.record_for(mig_node, pod, "cuda")
        [cdi_name] = record["cdiDevices"]
        spec = json.loads((agent_dir / "cdi" / f"gpumgr.io-vgpu_{uid}.json").read_text())
        [device] = [d for d in spec["devices"] if f"gpumgr.io/vgpu={d['name']}" == cdi_name]
        nodes = [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]]
        assert nodes[0] == f"/dev/nvidia{card}" and len([n for n in nodes if "nvidia-caps" in n]) == 2, nodes
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == mig_uuid and env["LD_PRELOAD"].endswith("libvcuda.so"), env
        [vdevice] = [m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == "/etc/vcuda"]
        lines = [x for x in (Path(vdevice) / "limits").read_text().splitlines() if "=" in x and not x.startswith("#")]
        limits = dict(x.split("=", 1) for x in lines)
        assert limits["pod_uid"] == pod.metadata.uid and limits["core_limit"] == "50", limits
        assert (limits["device0_uuid"], limits["device0_index"], limits["device0_memory_limit"]) == (
            mig_uuid, str(card), str(4 << 30)), limits
        assert limits["device0_compute"] == "gpm", limits  # an H100 instance: GPM per-instance feedback

    w.delete_all(core)
    _delete_claims(realk8s)
    wait_for("the shared instance destroyed", lambda: not [s for s in _slots(mig_node) if s.origin == "claim"],
             120, procs=(proc,))


MIG_SHARED_NODE = "mig-shared-node"
MIG_1G_SHARED = "nvidia.com/mig-1g.10gb.shared"


@pytest.fixture
def mig_shared_node(realk8s: Env) -> Iterator[Node]:
    """A node like `mig_node` whose layout's 1g.10gb instances are served as shares: two replicas each
    (`--mig-shared=1g.10gb=2`, what the chart renders for agent.mig.shared; tests/chart/test_chart_mig.py)."""
    with running_mig_node(realk8s, MIG_SHARED_NODE, ("--mig-shared=1g.10gb=2",)) as node:
        yield node


def test_a_share_inside_a_mig_instance_gets_its_memory_limit(realk8s: Env, mig_shared_node: Node) -> None:
    core = realk8s.core()
    proc = realk8s.gpumgr.agents[MIG_SHARED_NODE]
    pod, record = run_one_mig_pod(realk8s, mig_shared_node, MIG_1G_SHARED, 6, "mig-share")  # 3 instances x 2
    wait_for("GPU Feature Discovery's replicas label", lambda: (core.read_node(MIG_SHARED_NODE).metadata.labels or {})
             .get("nvidia.com/mig-1g.10gb.replicas") == "2", 60, procs=(proc,))
    labels = core.read_node(MIG_SHARED_NODE).metadata.labels or {}
    envs = record["envs"]
    mig_uuid = envs["NVIDIA_VISIBLE_DEVICES"]
    assert envs["LD_PRELOAD"] == "/usr/local/gpumgr/lib64/libvcuda.so" and envs["VCUDA_LIMITS"] == "/etc/vcuda/limits"
    mounts = {m["containerPath"]: m for m in record["mounts"]}
    assert {"/usr/local/nvidia/lib64", "/etc/vcuda", "/usr/local/gpumgr"} <= set(mounts), mounts
    (slot,) = [s for s in _slots(mig_shared_node) if s.uuid == mig_uuid]
    half = slot.memory_mib // 2
    # the limits file the agent wrote at PreStartContainer: half the instance's memory, on the MIG UUID
    vdir = Path(mounts["/etc/vcuda"]["hostPath"])
    wait_for("the share's limits file", lambda: (vdir / "limits").exists(), 60, procs=(proc,))
    written = dict(line.split("=", 1) for line in (vdir / "limits").read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    assert written["device0_uuid"] == mig_uuid and written["device0_memory_limit"] == str(half << 20), written
    assert written["core_limit"] == "50" and written["pod_uid"] == pod.metadata.uid, written
    assert written["device0_compute"] == "gpm", written  # an H100 instance: GPM per-instance feedback
    # the vDevice server the shim would call answers the same
    import grpc

    from gpumgr.pb import vdevice_pb2 as vpb
    from gpumgr.pb import vdevice_pb2_grpc as vpb_grpc

    with grpc.insecure_channel(f"unix://{vdir / 'vcuda.sock'}") as channel:
        answer = vpb_grpc.VDeviceStub(channel).Register(vpb.RegisterRequest(), timeout=30)
    assert [(d.uuid, d.memory_limit_bytes) for d in answer.devices] == [(mig_uuid, half << 20)]
    assert labels.get("nvidia.com/mig-1g.10gb.sharing-strategy") == "time-slicing", labels
