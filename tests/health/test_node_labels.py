"""Node labels from an inventory, and the minimal label patch."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumgr.devices.types import GPU, Inventory
from gpumgr.node.labels import GAIA_MODEL_LABEL, label_value, labels_patch, node_labels, normalise_prefix

VALID_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def node(*cards: tuple[str, int], driver: str = "550.54.15", cuda: str = "12.4") -> Inventory:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i}", minor=i, name=name, memory_mib=mib)
                 for i, (name, mib) in enumerate(cards))
    n = len(gpus)
    levels = tuple(tuple("X" if i == j else "PIX" for j in range(n)) for i in range(n))
    return Inventory(gpus=gpus, levels=levels, driver_version=driver, cuda_driver_version=cuda)


A100 = ("NVIDIA A100-SXM4-40GB", 40960)
V100 = ("Tesla V100-SXM2-16GB", 16160)


def apply(labels: dict[str, str], patch: dict[str, str | None] | None) -> dict[str, str]:
    """What the API server does with a JSON merge patch of metadata.labels."""
    out = dict(labels)
    for k, v in (patch or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


# -- node_labels --------------------------------------------------------------------------------------------------
def test_labels_of_a_uniform_node() -> None:
    assert node_labels(node(*[A100] * 8)) == {
        "gpumgr.io/gpu": "true",
        "gpumgr.io/gpu.count": "8",
        "gpumgr.io/gpu.model": "NVIDIA-A100-SXM4-40GB",
        "gpumgr.io/gpu.models": "1",
        "gpumgr.io/gpu.memory": "40960",
        "gpumgr.io/driver-version": "550.54.15",
        "gpumgr.io/driver-version.major": "550",
        "gpumgr.io/driver-version.minor": "54",
        "gpumgr.io/cuda.driver-version": "12.4",
        "gpumgr.io/cuda.driver-version.major": "12",
        "gpumgr.io/cuda.driver-version.minor": "4",
        "gaia.tencent.com/gpu-model": "A100-SXM4-40GB",
    }


def test_gpu_manager_model_label_is_the_second_word_of_card_0() -> None:
    assert node_labels(node(V100, A100, A100))[GAIA_MODEL_LABEL] == "V100-SXM2-16GB"
    assert node_labels(node(("NVIDIA GeForce RTX 3090", 24576)))[GAIA_MODEL_LABEL] == "GeForce"
    assert node_labels(node(("H100", 81559)))[GAIA_MODEL_LABEL] == "H100"  # one word: the word itself


def test_mixed_models_name_the_most_common_and_count_the_models() -> None:
    labels = node_labels(node(V100, A100, A100))
    assert labels["gpumgr.io/gpu.model"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["gpumgr.io/gpu.models"] == "2"
    assert labels["gpumgr.io/gpu.count"] == "3"
    assert labels["gpumgr.io/gpu.memory"] == "16160"  # the smallest card


def test_a_tie_between_models_goes_to_the_lowest_card() -> None:
    assert node_labels(node(V100, A100))["gpumgr.io/gpu.model"] == "Tesla-V100-SXM2-16GB"
    assert node_labels(node(A100, V100))["gpumgr.io/gpu.model"] == "NVIDIA-A100-SXM4-40GB"


def test_unknown_versions_are_left_out() -> None:
    labels = node_labels(node(A100, driver="", cuda=""))
    assert not any("version" in k for k in labels)
    odd = node_labels(node(A100, driver="r550 beta", cuda="12"))
    assert odd["gpumgr.io/driver-version"] == "r550-beta"
    assert "gpumgr.io/driver-version.major" not in odd
    assert odd["gpumgr.io/cuda.driver-version.major"] == "12"
    assert "gpumgr.io/cuda.driver-version.minor" not in odd


def test_a_node_without_gpus_has_no_labels() -> None:
    assert node_labels(node()) == {}


def test_prefix_is_configurable_and_checked() -> None:
    labels = node_labels(node(A100), prefix="example.com")
    assert labels["example.com/gpu"] == "true"
    assert not any(k.startswith("gpumgr.io/") for k in labels)
    assert normalise_prefix("gpumgr.io/") == "gpumgr.io/"
    for bad in ("Gpumgr.io/", "gpu_mgr.io", "", "-x.io/", "a/b/"):
        with pytest.raises(ValueError, match="DNS subdomain"):
            node_labels(node(A100), prefix=bad)


# -- label_value --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, value", [
    ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe"),
    ("NVIDIA H100 80GB HBM3 (MIG 1g.10gb)", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
    ("  Tesla  T4  ", "Tesla-T4"),
    ("Quadro RTX 6000 / 8000", "Quadro-RTX-6000-8000"),
    ("GeForce RTX™ 4090", "GeForce-RTX-4090"),
    ("_.-", ""),
    ("X" * 62 + " Y", "X" * 62),  # cut at 63, then no trailing dash
])
def test_label_values_are_sanitised(raw: str, value: str) -> None:
    assert label_value(raw) == value


@given(st.text())
def test_any_text_becomes_a_valid_label_value(raw: str) -> None:
    value = label_value(raw)
    assert len(value) <= 63
    assert VALID_VALUE.fullmatch(value)


@given(st.text(min_size=1), st.integers(min_value=1, max_value=10**6))
def test_labels_from_any_name_are_valid(name: str, mib: int) -> None:
    for key, value in node_labels(node((name, mib), driver=name, cuda=name)).items():
        assert value and len(value) <= 63 and VALID_VALUE.fullmatch(value), (key, value)
        assert len(key.split("/", 1)[1]) <= 63


# -- labels_patch -------------------------------------------------------------------------------------------------
OTHERS = {"kubernetes.io/hostname": "node-a", "nvidia.com/gpu.product": "A100", "gpumgr.iox/keep": "1"}


def test_nothing_to_change_gives_no_patch() -> None:
    wanted = node_labels(node(A100, A100))
    assert labels_patch({**OTHERS, **wanted}, wanted) is None
    assert labels_patch({}, {}) is None
    assert labels_patch(None, {}) is None


def test_patch_names_only_what_changed() -> None:
    old = node_labels(node(A100, A100))
    new = node_labels(node(A100, A100, A100))
    assert labels_patch({**OTHERS, **old}, new) == {"gpumgr.io/gpu.count": "3"}


def test_first_labelling_sets_every_label() -> None:
    wanted = node_labels(node(A100))
    assert labels_patch(OTHERS, wanted) == wanted


def test_stale_labels_under_our_prefix_are_removed_and_others_kept() -> None:
    current = {**OTHERS, **node_labels(node(A100)), "gpumgr.io/old-label": "x"}
    wanted = node_labels(node(A100, driver=""))
    assert labels_patch(current, wanted) == {
        "gpumgr.io/old-label": None,
        "gpumgr.io/driver-version": None,
        "gpumgr.io/driver-version.major": None,
        "gpumgr.io/driver-version.minor": None,
    }


def test_losing_every_gpu_removes_our_labels_including_gpu_managers() -> None:
    current = {**OTHERS, **node_labels(node(A100))}
    patch = labels_patch(current, node_labels(node()))
    assert patch is not None
    assert apply(current, patch) == OTHERS


def test_patch_respects_a_custom_prefix() -> None:
    current = {"gpumgr.io/gpu": "true", "example.com/stale": "1"}
    assert labels_patch(current, {"example.com/gpu": "true"}, prefix="example.com/") == {
        "example.com/gpu": "true", "example.com/stale": None,
    }


label_maps = st.dictionaries(
    st.sampled_from(["gpumgr.io/gpu", "gpumgr.io/gpu.count", "gpumgr.io/x", GAIA_MODEL_LABEL, "other.io/a", "b"]),
    st.sampled_from(["1", "2", "true"]),
)


@given(label_maps, label_maps)
def test_patch_reaches_wanted_then_no_churn(current: dict[str, str], wanted_all: dict[str, str]) -> None:
    wanted = {k: v for k, v in wanted_all.items() if k.startswith("gpumgr.io/") or k == GAIA_MODEL_LABEL}
    after = apply(current, labels_patch(current, wanted))
    ours = {k: v for k, v in after.items() if k.startswith("gpumgr.io/") or k == GAIA_MODEL_LABEL}
    assert ours == wanted
    assert {k: v for k, v in after.items() if k not in ours} == {
        k: v for k, v in current.items() if not (k.startswith("gpumgr.io/") or k == GAIA_MODEL_LABEL)}
    assert labels_patch(after, wanted) is None
