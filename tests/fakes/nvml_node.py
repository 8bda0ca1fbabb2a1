"""The test side of the fake libnvidia-ml.so.1 in tests/fakes/libnvml: build it and find its variants. The node
description and the commands that drive it are in gpumgr.devices.fake_nvml_node (the demo uses them too)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpumgr.devices import fake_nvml_node
from gpumgr.devices.fake_nvml_node import ENV, FakeNvmlNode, sysfs_bus

LIBNVML_DIR = fake_nvml_node.LIBRARY_DIR
VARIANTS = ("current", "no-procs-v3", "no-wait-v2", "no-remote-type", "old", "no-event-types")

__all__ = ["ENV", "LIBNVML_DIR", "VARIANTS", "FakeNvmlNode", "build", "library", "sysfs_bus"]


def build() -> None:
    """Build every variant (make is incremental: cheap when nothing changed)."""
    subprocess.run(["make", "-s", "-C", str(LIBNVML_DIR)], check=True, capture_output=True, timeout=120)


def library(variant: str = "current") -> Path:
    if variant not in VARIANTS:
        raise ValueError(f"unknown fake NVML variant {variant!r}")
    return fake_nvml_node.library(variant)
