"""Device plugins on a real kubelet: pods asking tencent.com/vcuda-* are mutated by the webhook the API server
calls, scheduled by kube-scheduler through the extender, admitted by the real kubelet through the agent's
device plugins, and started on the fake runtime with what the agent's Allocate answer said."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import CARD_MEMORY_MIB, CARDS, NODE, Env, capacity
from tests.realk8s.procs import wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def core(realk8s: Env) -> Any:
    api = realk8s.core()
    w.ensure_namespace(api)
    yield api
    w.delete_all(api)


def test_node_capacity_has_both_resources(realk8s: Env) -> None:
    cap = capacity(realk8s)
    assert cap[w.CORE] == str(100 * CARDS)
    assert cap[w.MEMORY] == str(CARDS * CARD_MEMORY_MIB // 256)


def test_fractional_pod_runs_with_the_promised_container_edits(realk8s: Env, core: Any) -> None:
    w.create(core, w.gpu_pod("frac", cores=30, memory_units=16))
    pod = w.wait_running(core, "frac")
    assert pod.spec.scheduler_name == "gpumgr-scheduler"  # the webhook, called by the API server
    assert pod.spec.node_name == NODE
    ann = pod.metadata.annotations
    assert ann["tencent.com/predicate-node"] == NODE
    minor = ann["tencent.com/predicate-gpu-idx-0"]
    assert minor.isdigit()
    record = w.record_for(realk8s.node, pod, "cuda0")
    envs = record["envs"]
    assert envs["LD_PRELOAD"] == "/usr/local/gpumgr/lib64/libvcuda.so"
    assert envs["LD_LIBRARY_PATH"] == "/usr/local/gpumgr/lib64:/usr/local/nvidia/lib64"
    assert envs["VCUDA_SOCKET"] == "/etc/vcuda/vcuda.sock"
    assert envs["VCUDA_LIMITS"] == "/etc/vcuda/limits"
    assert len(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == 1
    devices = {d["containerPath"] for d in record["devices"]}
    assert devices == {f"/dev/nvidia{minor}", "/dev/nvidiactl"}
    mounts = {m["containerPath"]: m for m in record["mounts"]}
    assert {"/usr/local/nvidia/lib64", "/etc/vcuda", "/usr/local/gpumgr"} <= set(mounts)
    assert all(mounts[p]["readOnly"] for p in ("/usr/local/nvidia/lib64", "/etc/vcuda", "/usr/local/gpumgr"))
    assert record["annotations"]["tencent.com/vcuda-core"] == "30"
    assert record["annotations"]["tencent.com/vcuda-device"] == f"/dev/nvidia{minor}"
    # the limits file the agent wrote at PreStartContainer: this pod's own limits
    limits = _limits(Path(mounts["/etc/vcuda"]["hostPath"]) / "limits")
    assert limits["device0_memory_limit"] == str(16 * 256 * 1024 * 1024), limits
    assert limits["core_limit"] == "30" and limits["device_count"] == "1", limits
    assert limits["pod_uid"] == pod.metadata.uid and limits["container_name"] == "cuda0"
    # the vDevice server the shim would call, on the socket in the directory the container mounts
    answer = _register(Path(mounts["/etc/vcuda"]["hostPath"]) / "vcuda.sock")
    assert answer.core_limit == 30 and len(answer.devices) == 1
    assert answer.devices[0].memory_limit_bytes == 16 * 256 * 1024 * 1024
    assert answer.devices[0].uuid == envs["NVIDIA_VISIBLE_DEVICES"]
    wait_for("gpu-assigned=true on the pod", lambda: core.read_namespaced_pod("frac", w.NAMESPACE)
             .metadata.annotations.get("tencent.com/gpu-assigned") == "true", 30)


def test_whole_card_and_two_card_pods(realk8s: Env, core: Any) -> None:
    w.create(core, w.gpu_pod("whole", cores=100))
    w.create(core, w.gpu_pod("pair", cores=200))
    whole = w.wait_running(core, "whole")
    pair = w.wait_running(core, "pair")
    one = w.record_for(realk8s.node, whole, "cuda0")
    two = w.record_for(realk8s.node, pair, "cuda0")
    assert "LD_PRELOAD" not in one["envs"] and "LD_PRELOAD" not in two["envs"]
    assert len(one["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == 1
    assert len(two["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2
    cards_one = {d["containerPath"] for d in one["devices"]} - {"/dev/nvidiactl"}
    cards_two = {d["containerPath"] for d in two["devices"]} - {"/dev/nvidiactl"}
    assert len(cards_one) == 1 and len(cards_two) == 2 and not cards_one & cards_two
    idx = pair.metadata.annotations["tencent.com/predicate-gpu-idx-0"].split(",")
    assert {f"/dev/nvidia{i}" for i in idx} == cards_two


def _register(socket: Path) -> Any:
    import grpc

    from gpumgr.pb import vdevice_pb2 as pb
    from gpumgr.pb import vdevice_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        return pb_grpc.VDeviceStub(channel).Register(pb.RegisterRequest(), timeout=30)


def _limits(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)
