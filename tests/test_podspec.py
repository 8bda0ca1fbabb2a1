"""Reading what pods ask for."""

from __future__ import annotations

import pytest

from gpumgr.requests import podspec


@pytest.mark.parametrize(("raw", "want"), [("30", 30), (30, 30), ("1k", 1000), ("2e3", 2000), ("1000m", 1),
                                           ("1.5k", 1500), ("2Ki", 2048), (None, 0)])
def test_quantities_in_kubernetes_forms(raw, want):
    assert podspec.quantity(raw) == want


@pytest.mark.parametrize("raw", ["1500m", "0.5", "abc", "-3", True, "1x"])
def test_non_whole_or_malformed_quantities_are_refused(raw):
    with pytest.raises(ValueError):
        podspec.quantity(raw)


def test_gpu_containers_and_model_filter():
    pod = {"metadata": {"annotations": {podspec.ANN_GPU_MODEL: "A100, h100", podspec.ANN_GPU_MODEL_EXCLUDE: "PCIe"}},
           "spec": {"initContainers": [{"name": "i", "resources": {"limits": {podspec.RESOURCE_CORE: "10",
                                                                              podspec.RESOURCE_MEMORY: "1"}}}],
                    "containers": [{"name": "cpu"},
                                   {"name": "g", "resources": {"requests": {podspec.RESOURCE_CORE: "1k"}}}]}}
    asks = podspec.gpu_containers(pod, include_init=True)
    assert [(a.name, a.index, a.cores, a.init) for a in asks] == [("i", 0, 10, True), ("g", 1, 1000, False)]
    ok, no = podspec.model_filter(pod)
    assert podspec.model_matches("NVIDIA H100 80GB HBM3", ok, no)
    assert not podspec.model_matches("NVIDIA A100-PCIE-40GB", ok, no)
    assert not podspec.model_matches("Tesla T4", ok, no)


@pytest.mark.parametrize(("text", "want"), [("0", 0), ("42", 42), ("123456", 123456), ("1234567", None), ("", None),
                                            ("-1", None), ("+1", None), (" 1", None), ("\u0663", None),
                                            ("\uff13\uff10", None), ("\u00b2", None)])
def test_ascii_uint_takes_only_ascii_digits(text, want):
    assert podspec.ascii_uint(text, 6) == want


def test_predicate_minors_are_ascii_card_minors():
    def pod(value: str) -> dict:
        return {"metadata": {"annotations": {f"{podspec.ANN_PREDICATE_IDX}0": value}}}

    assert podspec.predicate_minors(pod("0, 3,"), 0) == [0, 3]
    assert podspec.predicate_minors(pod(" "), 0) is None
    assert podspec.predicate_minors(pod("1,\u0663"), 0) is None
    assert podspec.predicate_minors(pod(",".join(["1"] * 65)), 0) is None


@pytest.mark.parametrize(("key", "text", "named"), [
    (podspec.ANN_GPU_MODEL, ",".join(f"m{i}" for i in range(100_000)), "more than 32 models"),
    (podspec.ANN_GPU_MODEL_EXCLUDE, ",".join(["A100"] * 33), "more than 32 models"),
    (podspec.ANN_GPU_MODEL, "x" * 129, "longer than 128 characters"),
])
def test_a_model_filter_too_long_to_match_cheaply_is_refused_naming_the_annotation(key, text, named):
    with pytest.raises(ValueError) as e:
        podspec.model_filter({"metadata": {"annotations": {key: text}}})
    assert key in str(e.value) and named in str(e.value)


def test_a_model_filter_at_the_limits_is_read_and_malformed_metadata_reads_as_no_filter():
    full = ",".join(f"model-{i}" for i in range(podspec.MAX_MODEL_ENTRIES)) + ", ,"
    ok, no = podspec.model_filter({"metadata": {"annotations": {podspec.ANN_GPU_MODEL: full,
                                                                podspec.ANN_GPU_MODEL_EXCLUDE: "y" * 128}}})
    assert len(ok) == podspec.MAX_MODEL_ENTRIES and no == ["y" * 128]
    for pod in ({"metadata": None}, {"metadata": {"annotations": ["a"]}}, {}):
        assert podspec.model_filter(pod) == ([], [])
