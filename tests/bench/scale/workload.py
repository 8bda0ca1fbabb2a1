"""The pods of one run, the same shapes on every path: 60 % a share of one card (10-50 cores, 1-16 GiB), 30 % one
whole card, 10 % two or four whole cards on one NVLink domain. Seeded, so every path and every run gets the same
sequence.

Per path a pod asks its shape as:
  a  `example.com/gpu: <cards>` (a share rounds up to one whole card), default scheduler;
  b  `tencent.com/vcuda-core` (+ `vcuda-memory` in 256 MiB units for a share), the chart's gpumgr-scheduler;
  c  a ResourceClaim per pod, created just before it (the chart's DeviceClasses: capacity {memory, cores} for a
     share, whole cards with `matchAttribute: nvlinkDomain` for 2 and 4), default scheduler; or, with
     --claims template, one ResourceClaimTemplate per shape (the controller-manager creates each pod's claim);
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


def pod_body(path: str, i: int, shape: Shape, namespace: str, claims: str = "pod") -> dict[str, Any]:
    """The pod of shape `shape` on `path`; a DRA pod names its own claim `pod_name(i)` (created just before it,
    see claim_body) or, with claims="template", a ResourceClaimTemplate the controller-manager makes a claim of."""
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                            "schedulerName": GPUMGR_SCHEDULER if path in ("b", "d") else "default-scheduler"}
    container: dict[str, Any] = {"name": "cuda", "image": IMAGE}
    if path == "a":
        container["resources"] = {"limits": {BASELINE_RESOURCE: str(shape.cards)}}
    elif uses_claim(path, i):
        container["resources"] = {"claims": [{"name": "gpu"}]}
        source = ({"resourceClaimTemplateName": template_name(shape)} if claims == "template"
                  else {"resourceClaimName": pod_name(i)})
        spec["resourceClaims"] = [{"name": "gpu", **source}]
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


def claim_body(i: int, shape: Shape, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": pod_name(i), "namespace": namespace}, "spec": claim_spec(shape)}


def templates(all_shapes: list[Shape], namespace: str) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per distinct shape."""
    return list({template_name(s): {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                    "metadata": {"name": template_name(s), "namespace": namespace},
                                    "spec": {"spec": claim_spec(s)}} for s in all_shapes}.values())


def claim_spec(s: Shape) -> dict[str, Any]:
    exactly: dict[str, Any] = {"allocationMode": "ExactCount", "count": s.cards}
    if s.fractional:
        exactly["deviceClassName"] = FRACTIONAL_CLASS
        exactly["capacity"] = {"requests": {"memory": f"{s.memory_mib}Mi", "cores": str(s.cores)}}
    else:
        exactly["deviceClassName"] = WHOLE_CLASS
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if s.cards > 1:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]
    return {"devices": devices}


@dataclass(frozen=True)
class Shape:
    cards: int
    cores: int  # per card; 100 = whole cards
    memory_mib: int  # 0 for whole cards

    @property
    def fractional(self) -> bool:
        return self.cores < 100
