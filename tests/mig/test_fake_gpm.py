"""GPM in the fake libnvidia-ml.so.1, through the real nvidia-ml-py: supported on Hopper and later, not on Ampere;
per-GPU-instance samples through the card (nvmlGpmMigSampleGet); SM utilisation computed from two samples follows
the load put on that instance; the calls' argument and version errors."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pynvml as nv
import pytest

from gpumgr.devices.arch import has_gpm
from gpumgr.devices.types import GPU, Inventory
from tests.fakes.nvml_fixtures import MakeBackend
from tests.mig.test_fake_mig import create, mig_node, open_card


def metrics(s1: Any, s2: Any, ids: list[int]) -> list[tuple[int, float]]:
    """(nvmlReturn, value) per metric id, from two samples."""
    m = nv.c_nvmlGpmMetricsGet_t()
    m.version = nv.NVML_GPM_METRICS_GET_VERSION
    m.numMetrics = len(ids)
    m.sample1, m.sample2 = s1, s2
    for i, mid in enumerate(ids):
        m.metrics[i].metricId = mid
    nv.nvmlGpmMetricsGet(m)
    return [(m.metrics[i].nvmlReturn, m.metrics[i].value) for i in range(len(ids))]


def instance_util(h: Any, gi: int, seconds: float = 0.3) -> float:
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    try:
        nv.nvmlGpmMigSampleGet(h, gi, s1)
        time.sleep(seconds)  # NVML wants at least 100 ms between two samples
        nv.nvmlGpmMigSampleGet(h, gi, s2)
        [(rc, value)] = metrics(s1, s2, [nv.NVML_GPM_METRIC_SM_UTIL])
        assert rc == nv.NVML_SUCCESS
        return float(value)
    finally:
        nv.nvmlGpmSampleFree(s1)
        nv.nvmlGpmSampleFree(s2)


@pytest.mark.parametrize(("family", "arch", "supported"), [
    ("h100-80", nv.NVML_DEVICE_ARCH_HOPPER, 1), ("h200", nv.NVML_DEVICE_ARCH_HOPPER, 1),
    ("a100-80", nv.NVML_DEVICE_ARCH_AMPERE, 0), ("a100-40", nv.NVML_DEVICE_ARCH_AMPERE, 0),
    ("a30", nv.NVML_DEVICE_ARCH_AMPERE, 0),
])
def test_gpm_is_supported_on_hopper_and_later_only(make_backend: MakeBackend, family: str, arch: int,
                                                   supported: int):
    h, _ = open_card(make_backend, family)
    assert nv.nvmlDeviceGetArchitecture(h) == arch
    assert nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == supported
    gi, _ = create(h, 19 if family != "a30" else 14, 0)
    gi_id = nv.nvmlGpuInstanceGetInfo(gi).id
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nv.nvmlDeviceGetArchitecture(mig) == arch  # a MIG device is of its card's architecture
    sample = nv.nvmlGpmSampleAlloc()
    try:
        if supported:
            nv.nvmlGpmMigSampleGet(h, gi_id, sample)
            nv.nvmlGpmSampleGet(h, sample)
        else:
            with pytest.raises(nv.NVMLError_NotSupported):
                nv.nvmlGpmMigSampleGet(h, gi_id, sample)
            with pytest.raises(nv.NVMLError_NotSupported):
                nv.nvmlGpmSampleGet(h, sample)
        with pytest.raises(nv.NVMLError_NotSupported):  # per-instance samples go through the card
            nv.nvmlGpmSampleGet(mig, sample)
    finally:
        nv.nvmlGpmSampleFree(sample)


def test_instance_sm_utilisation_follows_its_load(make_backend: MakeBackend):
    h, node = open_card(make_backend, "h100-80")
    gi_a, _ = create(h, 19, 0)
    gi_b, _ = create(h, 19, 1)
    a, b = nv.nvmlGpuInstanceGetInfo(gi_a).id, nv.nvmlGpuInstanceGetInfo(gi_b).id
    node.gpm_load(0, a, 30)
    node.gpm_load(0, b, 80)
    nv.nvmlDeviceGetCount()  # the library reads the control file at its next call
    assert instance_util(h, a) == pytest.approx(30, abs=1)
    assert instance_util(h, b) == pytest.approx(80, abs=1)  # each instance its own figure
    node.gpm_load(0, a, 0)
    nv.nvmlDeviceGetCount()
    assert instance_util(h, a) == pytest.approx(0, abs=1)
    # The per-process and device utilisation calls stay NOT_SUPPORTED on the instance: GPM is what there is.
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetProcessUtilization(mig, 0)


def test_whole_card_samples_and_metrics_not_modelled(make_backend: MakeBackend, tmp_path: Any):
    inv = Inventory(gpus=(GPU(index=0, uuid="GPU-00000000-h100", minor=0, name="NVIDIA H100 80GB HBM3",
                              memory_mib=81920),), levels=(("X",),))
    backend, node = make_backend(inv)
    backend.inventory()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    node.gpm_load(0, None, 55)
    nv.nvmlDeviceGetCount()
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    time.sleep(0.3)
    nv.nvmlGpmSampleGet(h, s2)
    got = metrics(s1, s2, [nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_DRAM_BW_UTIL])
    assert got[0][0] == nv.NVML_SUCCESS and got[0][1] == pytest.approx(55, abs=1)
    assert got[1][0] == nv.NVML_ERROR_NOT_SUPPORTED  # a counter the fake does not model says so
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)


def test_argument_and_version_errors(make_backend: MakeBackend):
    h, _ = open_card(make_backend, "h100-80")
    gi, _ = create(h, 19, 0)
    gi_id = nv.nvmlGpuInstanceGetInfo(gi).id
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    try:
        with pytest.raises(nv.NVMLError_NotFound):  # no such GPU instance
            nv.nvmlGpmMigSampleGet(h, 13, s1)
        with pytest.raises(nv.NVMLError_InvalidArgument):  # two samples never taken
            metrics(s1, s2, [nv.NVML_GPM_METRIC_SM_UTIL])
        nv.nvmlGpmMigSampleGet(h, gi_id, s1)
        nv.nvmlGpmSampleGet(h, s2)
        with pytest.raises(nv.NVMLError_InvalidArgument):  # an instance's sample and the card's
            metrics(s1, s2, [nv.NVML_GPM_METRIC_SM_UTIL])
        m = nv.c_nvmlGpmMetricsGet_t()
        m.version = 2
        m.numMetrics = 1
        m.sample1, m.sample2 = s1, s1
        with pytest.raises(nv.NVMLError_ArgumentVersionMismatch):
            nv.nvmlGpmMetricsGet(m)
        sup = nv.c_nvmlGpmSupport_t()
        sup.version = 7
        fn = nv._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
        assert fn(h, ctypes.byref(sup)) == nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    finally:
        nv.nvmlGpmSampleFree(s1)
        nv.nvmlGpmSampleFree(s2)


def test_a_card_out_of_mig_mode_has_no_instance_samples(make_backend: MakeBackend):
    h, _ = open_card(make_backend, "h100-80", on=False)
    sample = nv.nvmlGpmSampleAlloc()
    try:
        with pytest.raises(nv.NVMLError_InvalidArgument):
            nv.nvmlGpmMigSampleGet(h, 1, sample)
        nv.nvmlGpmSampleGet(h, sample)  # the whole card still samples
    finally:
        nv.nvmlGpmSampleFree(sample)


@pytest.mark.parametrize(("family", "gpm"), [("h100-80", True), ("h200", True), ("a100-80", False), ("a30", False)])
def test_the_nvml_backend_reads_gpm_support_into_the_inventory(make_backend: MakeBackend, family: str, gpm: bool):
    backend, _ = make_backend(mig_node(family), mig={0: family})
    inv = backend.inventory()
    assert inv.gpus[0].gpm is gpm and has_gpm(inv.gpus[0]) is gpm
    assert Inventory.from_json(inv.to_json()).gpus[0].gpm is gpm  # the checkpointed inventory keeps it


def test_an_unread_card_is_judged_by_its_model_name():
    def card(name: str) -> GPU:
        return GPU(index=0, uuid="GPU-0", minor=0, name=name, memory_mib=1)

    assert has_gpm(card("NVIDIA H100 80GB HBM3")) and has_gpm(card("NVIDIA GH200 480GB"))
    assert has_gpm(card("NVIDIA B200")) and has_gpm(card("NVIDIA H200 NVL"))
    assert not has_gpm(card("NVIDIA A100-SXM4-80GB")) and not has_gpm(card("NVIDIA A30"))
    assert not has_gpm(card("Tesla V100-SXM2-16GB")) and not has_gpm(card("NVIDIA L40S"))
    assert GPU.from_json(card("NVIDIA A30").to_json()).gpm is None  # nothing read: nothing written
