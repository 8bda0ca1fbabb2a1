"""MIG tests run the real nvidia-ml-py over the fake libnvidia-ml.so.1 (see tests/fakes/libnvml/fake_nvml_mig.c)."""

from tests.fakes.nvml_fixtures import MakeBackend, _built, make_backend

__all__ = ["MakeBackend", "_built", "make_backend"]
