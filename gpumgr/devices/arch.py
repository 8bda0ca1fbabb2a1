"""A card's architecture as it matters to compute limits: GPM (GPU performance monitoring, per-GPU-instance SM
utilisation) exists on Hopper and later. Inside a MIG instance NVML has no per-process or device utilisation, so
GPM is the only measure the vCUDA shim's compute limiter can steer by there.

The NVML backend reads support from the card (nvmlGpmQueryDeviceSupport, or nvmlDeviceGetArchitecture where that
call is missing); a simulated card, or one NVML did not answer for, is judged by its model name.
"""

from __future__ import annotations

import re

from gpumgr.devices.types import GPU

# nvmlDeviceArchitecture_t
ARCH_AMPERE = 7
ARCH_HOPPER = 9
ARCH_UNKNOWN = 0xFFFFFFFF

# Model names of Hopper-and-later data-centre cards (H100, H200, H800, H20, GH200, B100, B200, GB200, B300...).
_GPM_MODEL = re.compile(r"\b(G?H(100|200|800|20)|G?B(100|200|300))\b", re.IGNORECASE)


def gpm_by_architecture(arch: int) -> bool:
    """Does a card of this NVML architecture have GPM?"""
    return arch != ARCH_UNKNOWN and arch >= ARCH_HOPPER


def gpm_by_model(name: str) -> bool:
    """Does a card of this model name have GPM (Hopper and later)?"""
    return _GPM_MODEL.search(name) is not None


def has_gpm(gpu: GPU) -> bool:
    """What the node knows of the card: NVML's answer when it gave one, else the model name."""
    return gpu.gpm if gpu.gpm is not None else gpm_by_model(gpu.name)


def compute_enforcement(gpu: GPU, mig: bool) -> str:
    """How a compute limit on this card is enforced: `process` (NVML per-process utilisation, outside MIG), `gpm`
    (inside a MIG instance on a card with GPM), `none` (inside a MIG instance on a card without it: not enforced)."""
    if not mig:
        return "process"
    return "gpm" if has_gpm(gpu) else "none"
