"""What the device plugins' `AllocationService` talks to (the pods it reads, the API calls it makes, the events it
counts) and its configuration: the seams the daemon and the tests plug into.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpumgr.deviceplugin import response


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]: ...
    def get(self, uid: str) -> dict[str, Any] | None: ...
    async def refresh(self) -> None: ...
    async def live_uids(self) -> set[str] | None: ...
    def known_finished(self, uid: str) -> bool: ...


class Annotator(Protocol):
    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> bool:
        ...

    async def record_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        ...

    async def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        ...


class Events(Protocol):
    def observe_allocate(self, seconds: float, ok: bool, reason: str = "") -> None: ...


@dataclass(frozen=True)
class ServiceConfig:
    kubelet_checkpoint: Path
    response: response.ResponseConfig
