"""The pods of one run, the same shapes on every path: 60 % a share of one card (10-50 cores, 1-16 GiB), 30 % one
whole card, 10 % two or four whole cards on one NVLink domain. Seeded, so every path and every run gets the same
sequence.

Per path a pod asks its shape as:
  a  `example.com/gpu: <cards>` (a share rounds up to one whole card), default scheduler;
  b  `tencent.com/vcuda-core` (+ `vcuda-memory` in 256 MiB units for a share), the chart's gpumgr-scheduler;
  c  a ResourceClaimTemplate per shape (the chart's DeviceClasses: capacity {memory, cores} for a share, whole
     cards with `matchAttribute: nvlinkDomain` for 2 and 4), default scheduler;
  d  the gpumgr-scheduler with even pods as in b and odd pods as in c.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gpumgr.requests import podspec
from tests.bench.scale.fleet import BASELINE_RESOURCE, DRIVER, UNIT_MIB

IMAGE = "registry.k8s.io/pause:3.10"
FRACTIONAL_CLASS = "vgpu.gpumgr.io"
WHOLE_CLASS = "gpu.gpumgr.io"
GPUMGR_SCHEDULER = "gpumgr-scheduler"
CORE_CHOICES = (10, 20, 25, 30, 50)
MEMORY_GIB_CHOICES = (1, 2, 4, 8, 12, 16)
PATHS = ("a", "b", "c", "d")


def shapes(count: int, seed: int = 21) -> list[Shape]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.6:
            out.append(Shape(1, rng.choice(CORE_CHOICES), rng.choice(MEMORY_GIB_CHOICES) * 1024))
        elif roll < 0.9:
            out.append(Shape(1, 100, 0))
        else:
            out.append(Shape(rng.choice((2, 4)), 100, 0))
    return out


def uses_claim(path: str, i: int) -> bool:
    return path == "c" or (path == "d" and i % 2 == 1)


def pod_body(path: str, i: int, shape: Shape, namespace: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                            "schedulerName": GPUMGR_SCHEDULER if path in ("b", "d") else "default-scheduler"}
    container: dict[str, Any] = {"name": "cuda", "image": IMAGE}
    if path == "a":
        container["resources"] = {"limits": {BASELINE_RESOURCE: str(shape.cards)}}
    elif uses_claim(path, i):
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template_name(shape)}]
    else:
        limits = {podspec.RESOURCE_CORE: str(shape.cores * shape.cards)}
        if shape.fractional:
            limits[podspec.RESOURCE_MEMORY] = str(shape.memory_mib // UNIT_MIB)
        container["resources"] = {"limits": limits}
    spec["containers"] = [container]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name(i), "namespace": namespace},
            "spec": spec}


def pod_name(i: int) -> str:
    return f"p{i:05d}"


def template_name(shape: Shape) -> str:
    return f"share-{shape.cores}-{shape.memory_mib}" if shape.fractional else f"whole-{shape.cards}"


def templates(all_shapes: list[Shape], namespace: str) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per distinct shape."""
    out = {}
    for s in all_shapes:
        exactly: dict[str, Any] = {"allocationMode": "ExactCount", "count": s.cards}
        if s.fractional:
            exactly["deviceClassName"] = FRACTIONAL_CLASS
            exactly["capacity"] = {"requests": {"memory": f"{s.memory_mib}Mi", "cores": str(s.cores)}}
        else:
            exactly["deviceClassName"] = WHOLE_CLASS
        devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
        if s.cards > 1:
            devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]
        out[template_name(s)] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                 "metadata": {"name": template_name(s), "namespace": namespace},
                                 "spec": {"spec": {"devices": devices}}}
    return list(out.values())


@dataclass(frozen=True)
class Shape:
    cards: int
    cores: int  # per card; 100 = whole cards
    memory_mib: int  # 0 for whole cards

    @property
    def fractional(self) -> bool:
        return self.cores < 100
