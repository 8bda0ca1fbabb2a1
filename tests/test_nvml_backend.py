"""NVML failures at start become one clear DiscoveryError (real nvidia-ml-py over the fake libnvidia-ml.so.1 of
tests/fakes/libnvml; the behaviour of a working node is in tests/nvml/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpumgr.devices.nvml import NvmlBackend
from gpumgr.devices.types import DiscoveryError
from tests.fakes import nvml_node
from tests.fakes.nvml_node import FakeNvmlNode
from tests.nvml.test_discovery import small_node

NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (NVML_ERROR_NO_PERMISSION, "no permission to use NVML"),
    ],
)
def test_nvml_init_failures_become_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int,
                                                   words: str):
    nvml_node.build()
    node = FakeNvmlNode(tmp_path, small_node(), init_error=code).write()
    monkeypatch.setenv(nvml_node.ENV, str(node.spec))
    with pytest.raises(DiscoveryError, match=words):
        NvmlBackend(library=str(nvml_node.library()))


def test_a_missing_library_file_is_named(tmp_path: Path):
    with pytest.raises(DiscoveryError, match=r"cannot load the NVML library .*nope/libnvidia-ml\.so\.1"):
        NvmlBackend(library=str(tmp_path / "nope" / "libnvidia-ml.so.1"))


def test_no_library_on_the_loader_path_says_what_to_install(tmp_path: Path):
    code = ("from gpumgr.devices.nvml import NvmlBackend\n"
            "from gpumgr.devices.types import DiscoveryError\n"
            "try:\n    NvmlBackend()\nexcept DiscoveryError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": str(Path.cwd())})
    assert p.returncode == 0, p.stderr
    assert "libnvidia-ml.so.1) was not found" in p.stdout
