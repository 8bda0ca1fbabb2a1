"""MIG in the fake libnvidia-ml.so.1, through the real nvidia-ml-py calls an agent makes: mode (a reset on Ampere,
none on Hopper), profiles (enum is not id), placements, create/destroy with placement, the errors of occupied
placements and busy instances, MIG device handles and UUIDs, per-instance memory, and the calls MIG does not
support."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pynvml as nv
import pytest

from gpumgr.devices.types import GPU, Inventory
from tests.fakes.nvml_fixtures import MakeBackend

NAMES = {"a100-40": "NVIDIA A100-SXM4-40GB", "a100-80": "NVIDIA A100-SXM4-80GB", "h100-80": "NVIDIA H100 80GB HBM3",
         "h200": "NVIDIA H200", "a30": "NVIDIA A30"}
MEMORY = {"a100-40": 40960, "a100-80": 81920, "h100-80": 81920, "h200": 143771, "a30": 24576}


def mig_node(family: str, count: int = 1) -> Inventory:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:08d}-mig", minor=i, name=NAMES[family], memory_mib=MEMORY[family])
                 for i in range(count))
    return Inventory(gpus=gpus, levels=tuple(tuple("X" if i == j else "SYS" for j in range(count))
                                            for i in range(count)))


def open_card(make_backend: MakeBackend, family: str, on: bool = True, **options: Any) -> tuple[Any, Any]:
    backend, node = make_backend(mig_node(family), mig={0: family}, mig_on=(0,) if on else (), **options)
    backend.inventory()
    return nv.nvmlDeviceGetHandleByIndex(0), node


def profiles(h: Any) -> dict[str, tuple[int, int, int]]:
    """name -> (enum, id, memory MiB), looping the enum as NVML documents (NOT_SUPPORTED: absent)."""
    out = {}
    for en in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, en)
        except nv.NVMLError_NotSupported:
            continue
        out[_text(info.name).removeprefix("MIG ")] = (en, info.id, info.memorySizeMB)
    return out


def placements(h: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    arr = (nv.c_nvmlGpuInstancePlacement_t * count.value)()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count))
    return [(p.start, p.size) for p in arr[: count.value]]


def create(h: Any, profile_id: int, start: int) -> tuple[Any, Any]:
    size = dict(placements(h, profile_id))[start]
    where = nv.c_nvmlGpuInstancePlacement_t(start, size)
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, ctypes.byref(where))  # NVML takes a pointer
    info = nv.nvmlGpuInstanceGetInfo(gi)
    full = nv.nvmlDeviceGetGpuInstanceProfileInfoById(h, info.profileId).sliceCount
    en = [1, 2, 3, 4, 7].index(full)
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, en)
    return gi, ci


@pytest.mark.parametrize(("family", "expected"), [
    ("a100-40", {"1g.5gb": (0, 19), "1g.5gb+me": (7, 20), "1g.10gb": (9, 15), "2g.10gb": (1, 14),
                 "3g.20gb": (2, 9), "4g.20gb": (3, 5), "7g.40gb": (4, 0)}),
    ("a100-80", {"1g.10gb": (0, 19), "1g.10gb+me": (7, 20), "1g.20gb": (9, 15), "2g.20gb": (1, 14),
                 "3g.40gb": (2, 9), "4g.40gb": (3, 5), "7g.80gb": (4, 0)}),
    ("h100-80", {"1g.10gb": (0, 19), "1g.10gb+me": (7, 20), "1g.20gb": (9, 15), "2g.20gb": (1, 14),
                 "3g.40gb": (2, 9), "4g.40gb": (3, 5), "7g.80gb": (4, 0)}),
    ("h200", {"1g.18gb": (0, 19), "1g.18gb+me": (7, 20), "1g.35gb": (9, 15), "2g.35gb": (1, 14),
              "3g.71gb": (2, 9), "4g.71gb": (3, 5), "7g.141gb": (4, 0)}),
    ("a30", {"1g.6gb": (0, 14), "1g.6gb+me": (7, 21), "2g.12gb": (1, 5), "2g.12gb+me": (8, 6), "4g.24gb": (3, 0)}),
])
def test_profiles_per_card_the_enum_is_not_the_id(make_backend: MakeBackend, family: str,
                                                  expected: dict[str, tuple[int, int]]):
    h, _ = open_card(make_backend, family)
    got = profiles(h)
    assert {k: v[:2] for k, v in got.items()} == expected
    for name, (_, _, mib) in got.items():  # memory a little under the nominal name, as real cards report
        nominal = int(name.split(".")[1].split("gb")[0]) * 1024
        assert 0.85 * nominal < mib <= nominal + 1024, (name, mib)


def test_placements_count_memory_slices_and_work_with_mig_off(make_backend: MakeBackend):
    h, _ = open_card(make_backend, "a100-80", on=False)
    assert placements(h, 19) == [(s, 1) for s in range(7)]
    assert placements(h, 15) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert placements(h, 14) == [(0, 2), (2, 2), (4, 2)]
    assert placements(h, 9) == [(0, 4), (4, 4)]
    assert placements(h, 5) == [(0, 4)] and placements(h, 0) == [(0, 8)]
    with pytest.raises(nv.NVMLError_NotSupported):  # but nothing can be created while MIG is off
        nv.nvmlDeviceCreateGpuInstance(h, 19)


def test_ampere_needs_a_reset_hopper_does_not(make_backend: MakeBackend):
    h, node = open_card(make_backend, "a100-40", on=False)
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nv.nvmlDeviceSetMigMode(h, nv.NVML_DEVICE_MIG_ENABLE) == nv.NVML_ERROR_RESET_REQUIRED
    assert nv.nvmlDeviceGetMigMode(h) == [0, 1]
    node.reset(0)
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    hop, _ = open_card(make_backend, "h100-80", on=False)
    assert nv.nvmlDeviceSetMigMode(hop, nv.NVML_DEVICE_MIG_ENABLE) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(hop) == [1, 1]


def test_a_card_without_mig_says_not_supported(make_backend: MakeBackend):
    backend, _ = make_backend(mig_node("a100-40"))
    backend.inventory()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetMigMode(h)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetGpuInstanceProfileInfo(h, 0)


def test_instances_overlap_and_busy_errors(make_backend: MakeBackend):
    h, node = open_card(make_backend, "a100-40")
    gi3, ci3 = create(h, 9, 4)  # 3g.20gb on memory slices 4..7
    with pytest.raises(nv.NVMLError_InsufficientResources):  # 2g at 4 overlaps it
        nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, ctypes.byref(nv.c_nvmlGpuInstancePlacement_t(4, 2)))
    with pytest.raises(nv.NVMLError_InvalidArgument):  # no 2g placement starts at 1
        nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, ctypes.byref(nv.c_nvmlGpuInstancePlacement_t(1, 2)))
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == 4  # 1g on slices 0..3
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    with pytest.raises(nv.NVMLError_InUse):  # a GI with a CI cannot go
        nv.nvmlGpuInstanceDestroy(gi3)
    ci_id = nv.nvmlComputeInstanceGetInfo(ci3).id
    gi_id = nv.nvmlGpuInstanceGetInfo(gi3).id
    node.instance_process(0, gi_id, ci_id, 4242)
    with pytest.raises(nv.NVMLError_InUse):  # a process runs on the CI
        nv.nvmlComputeInstanceDestroy(ci3)
    with pytest.raises(nv.NVMLError_InUse):  # MIG cannot be turned off under instances
        nv.nvmlDeviceSetMigMode(h, nv.NVML_DEVICE_MIG_DISABLE)
    node.instance_process(0, gi_id, ci_id, 4242, running=False)
    nv.nvmlComputeInstanceDestroy(ci3)
    nv.nvmlGpuInstanceDestroy(gi3)
    with pytest.raises(nv.NVMLError_InvalidArgument):  # a stale handle
        nv.nvmlGpuInstanceGetInfo(gi3)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 2


def test_mig_devices_uuids_memory_and_unsupported_calls(make_backend: MakeBackend):
    h, _ = open_card(make_backend, "a100-80")
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    gi, ci = create(h, 15, 2)  # 1g.20gb at memory slices 2..3
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nv.nvmlDeviceIsMigDeviceHandle(mig).value == 1 and nv.nvmlDeviceIsMigDeviceHandle(h).value == 0
    assert nv.nvmlDeviceGetGpuInstanceId(mig) == nv.nvmlGpuInstanceGetInfo(gi).id
    assert nv.nvmlDeviceGetComputeInstanceId(mig) == nv.nvmlComputeInstanceGetInfo(ci).id
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetGpuInstanceId(h)
    uuid = nv.nvmlDeviceGetUUID(mig)
    assert uuid.startswith("MIG-") and uuid != nv.nvmlDeviceGetUUID(h)
    assert nv.nvmlDeviceGetUUID(nv.nvmlComputeInstanceGetInfo(ci).device) == uuid
    assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert nv.nvmlDeviceGetUUID(parent) == nv.nvmlDeviceGetUUID(h)
    mem = nv.nvmlDeviceGetMemoryInfo(mig).total >> 20
    assert mem == nv.nvmlDeviceGetAttributes(mig).memorySizeMB == 20224
    assert nv.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount == 1
    assert nv.nvmlDeviceGetMemoryInfo(h).total >> 20 == 81920
    for call in (lambda d: nv.nvmlDeviceGetUtilizationRates(d), lambda d: nv.nvmlDeviceGetProcessUtilization(d, 0),
                 lambda d: nv.nvmlDeviceGetSamples(d, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)):
        for d in (mig, h):  # neither the instance nor its MIG-enabled parent
            with pytest.raises(nv.NVMLError_NotSupported):
                call(d)
    nv.nvmlComputeInstanceDestroy(ci)
    nv.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(nv.NVMLError_InvalidArgument):  # the MIG handle died with its instance
        nv.nvmlDeviceGetUUID(mig)
    _, _ = create(h, 15, 2)
    again = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    assert again.startswith("MIG-") and again != uuid  # a re-created instance has a new UUID


def test_instances_outlive_the_process_view_and_permissions(make_backend: MakeBackend, tmp_path: Path):
    h, node = open_card(make_backend, "h100-80")
    create(h, 19, 3)
    state = node.mig_state.read_text()
    assert "gi 0 " in state and "ci 0 " in state  # the "hardware" keeps them for the next process
    minors = node.mig_minors.read_text().splitlines()
    assert minors[:2] == ["config 1", "monitor 2"] and "gpu0/gi1/ci0/access 13" in minors
    hu, _ = open_card(make_backend, "h100-80", mig_privileged=False)
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceCreateGpuInstance(hu, 19)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
