"""24 fractional pods of mixed sizes created at once on a node they fit: all Running through the real scheduler,
extender and kubelet, and nothing over-committed (pods vs `gpumgr status` vs the kubelet's own checkpoint)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from typing import Any

import pytest

from tests.realk8s import workloads as w
from tests.realk8s.conftest import CARD_MEMORY_MIB, NODE, Env

pytestmark = pytest.mark.timeout(600)
PODS = 24


@pytest.fixture
def core(realk8s: Env) -> Any:
    api = realk8s.core()
    w.ensure_namespace(api)
    yield api
    w.delete_all(api, timeout_s=180)


def test_24_mixed_pods_at_once(realk8s: Env, core: Any) -> None:
    sizes = [(5 + 5 * (i % 4), 2 + i % 7) for i in range(PODS)]  # cores 5..20, memory 2..8 units: ~300 cores
    for i, (cores, units) in enumerate(sizes):
        w.create(core, w.gpu_pod(f"many-{i}", cores=cores, memory_units=units))
    pods = [w.wait_running(core, f"many-{i}", timeout_s=240) for i in range(PODS)]
    used_cores: dict[str, int] = defaultdict(int)
    used_units: dict[str, int] = defaultdict(int)
    for pod, (cores, units) in zip(pods, sizes, strict=True):
        assert pod.spec.node_name == NODE
        card = pod.metadata.annotations["tencent.com/predicate-gpu-idx-0"]
        used_cores[card] += cores
        used_units[card] += units
    assert all(v <= 100 for v in used_cores.values()), used_cores
    assert all(v <= CARD_MEMORY_MIB // 256 for v in used_units.values()), used_units
    # the kubelet's own checkpoint: every pod holds exactly its cores of vcuda-core device IDs
    checkpoint = json.loads((realk8s.node.device_plugin_dir / "kubelet_internal_checkpoint").read_text())
    entries = checkpoint["Data"]["PodDeviceEntries"]
    held: dict[str, int] = defaultdict(int)
    for entry in entries:
        if entry["ResourceName"] == w.CORE:
            held[entry["PodUID"]] += sum(len(ids) for ids in entry["DeviceIDs"].values())
    for pod, (cores, _) in zip(pods, sizes, strict=True):
        assert held[pod.metadata.uid] == cores, (pod.metadata.name, held[pod.metadata.uid])
    # the agent's own view (gpumgr status, from its /usage): the same pods, the same cores per card
    port = realk8s.gpumgr.agent_metrics[NODE]
    out = subprocess.run([sys.executable, "-m", "gpumgr.cli", "status", "--addr", f"127.0.0.1:{port}",
                          "--format", "json"], capture_output=True, text=True, timeout=60, check=True).stdout
    status = json.loads(out)
    text = json.dumps(status)
    for pod in pods:
        assert pod.metadata.uid in text or pod.metadata.name in text, pod.metadata.name
    # /metric: each pod's request as gpu-manager named it (cores / 100)
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metric", timeout=30) as answer:
        metric = answer.read().decode()
    for pod, (cores, _) in zip(pods, sizes, strict=True):
        lines = [x for x in metric.splitlines() if x.startswith("container_request_gpu_utilization{")
                 and f'pod_name="{pod.metadata.name}"' in x]
        assert len(lines) == 1 and float(lines[0].rsplit(" ", 1)[1]) == cores / 100, (pod.metadata.name, lines)
