"""Resolve fully-qualified CDI device names (`vendor.com/class=name`) to container edits, as a container runtime
(containerd, CRI-O) does: read every spec in the CDI directories, find each device, and apply the spec-level
`containerEdits` (once per spec) and the device's own edits."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_SPEC_BYTES = 1 << 20


class CdiResolveError(Exception):
    """A CDI name that no spec defines, or a spec that cannot be read."""


def load_specs(dirs: Iterable[Path]) -> dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]]:
    """kind -> (spec, device name -> device) for every spec in `dirs` (later directories win, as in CDI)."""
    out: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]] = {}
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.iterdir()):
            if path.suffix not in (".json", ".yaml", ".yml") or path.name.startswith("."):
                continue
            try:
                if path.stat().st_size > MAX_SPEC_BYTES:
                    raise CdiResolveError(f"CDI spec {path} is larger than {MAX_SPEC_BYTES} bytes")
                text = path.read_text()
                spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError) as e:
                raise CdiResolveError(f"CDI spec {path} cannot be read: {e}") from None
            kind = spec.get("kind") if isinstance(spec, dict) else None
            if not isinstance(kind, str):
                raise CdiResolveError(f"CDI spec {path} has no kind")
            names = [dev.get("name") for dev in spec.get("devices") or []]
            if len(set(names)) != len(names):
                raise CdiResolveError(f"CDI spec {path} is invalid: duplicate device name "
                                      f"{next(n for n in names if names.count(n) > 1)!r}")
            known = out.setdefault(kind, ({}, {}))[1]
            for dev in spec.get("devices") or []:
                known[dev["name"]] = {"spec": spec, "device": dev, "path": str(path)}
    return out


def resolve(names: Iterable[str], dirs: Iterable[Path]) -> ContainerEdits:
    specs = load_specs(list(dirs))
    edits = ContainerEdits()
    applied_specs: set[str] = set()
    for qualified in names:
        kind, sep, name = qualified.partition("=")
        if not sep or kind not in specs or name not in specs[kind][1]:
            raise CdiResolveError(f"CDI device {qualified!r} is not defined by any spec")
        entry = specs[kind][1][name]
        if entry["path"] not in applied_specs:
            applied_specs.add(entry["path"])
            edits.apply(entry["spec"].get("containerEdits") or {})
        edits.apply(entry["device"].get("containerEdits") or {})
    return edits


@dataclass
class ContainerEdits:
    env: dict[str, str] = field(default_factory=dict)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, edits: dict[str, Any]) -> None:
        for kv in edits.get("env") or []:
            k, _, v = str(kv).partition("=")
            self.env[k] = v
        for node in edits.get("deviceNodes") or []:
            if node not in self.device_nodes:
                self.device_nodes.append(dict(node))
        for m in edits.get("mounts") or []:
            if m not in self.mounts:
                self.mounts.append(dict(m))

    def mount_source(self, container_path: str) -> str | None:
        return next((m["hostPath"] for m in self.mounts if m.get("containerPath") == container_path), None)
