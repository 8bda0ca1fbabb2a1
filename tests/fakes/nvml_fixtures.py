"""Pytest fixtures for the NVML backend tests: the real nvidia-ml-py over the fake libnvidia-ml.so.1 of
tests/fakes/libnvml, in this process (the backend points pynvml at the variant's library)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumgr.devices.nvml import NvmlBackend
from gpumgr.devices.types import Inventory
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode

MakeBackend = Callable[..., tuple[NvmlBackend, FakeNvmlNode]]


@pytest.fixture(scope="session", autouse=True)
def _built() -> None:
    nvml_node.build()


@pytest.fixture
def make_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeBackend]:
    """make_backend(inventory, variant="current", sysfs_root=None, **node options) -> (backend, node)."""
    opened: list[NvmlBackend] = []
    counter = iter(range(1000))

    def make(inventory: Inventory, variant: str = "current", sysfs_root: Path | None = None,
             **options: Any) -> tuple[NvmlBackend, FakeNvmlNode]:
        node = FakeNvmlNode(tmp_path / f"node{next(counter)}", inventory, **options).write()
        monkeypatch.setenv(nvml_node.ENV, str(node.spec))
        backend = NvmlBackend(library=str(nvml_node.library(variant)),
                              sysfs_root=str(sysfs_root or tmp_path / "no-sysfs"))
        opened.append(backend)
        return backend, node

    yield make
    for b in opened:
        b.close()
