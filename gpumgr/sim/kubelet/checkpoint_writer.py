"""Write `kubelet_internal_checkpoint` in the kubelet's JSON layout, atomically.

Layout: `{"Data":{"PodDeviceEntries":[{"PodUID","ContainerName","ResourceName","DeviceIDs","AllocResp"}],
"RegisteredDevices":{resource:[ids]}},"Checksum":n}`. `DeviceIDs` is an object keyed by NUMA node ("v2",
what kubelets >= 1.20 write) or a flat list ("v1", older kubelets). `AllocResp` is base64 of the
serialized ContainerAllocateResponse. An empty entry list is written as `null`, as Go marshals a nil slice.

The real `Checksum` is FNV-32a over Go's spew dump of `Data`, which cannot be reproduced here; this
writer puts FNV-32a over its own canonical JSON of `Data` (sorted keys, no spaces). Readers must not
verify it (`gpumgr.node.kubelet_checkpoint` does not).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from gpumgr.node.kubelet_checkpoint import CHECKPOINT_FILE_NAME
from gpumgr.sim.kubelet.pod_devices import ContainerDevices

CheckpointFormat = Literal["v1", "v2"]
CHECKPOINT_FORMATS: tuple[CheckpointFormat, ...] = ("v1", "v2")


def checkpoint_data(
    entries: Iterable[ContainerDevices],
    registered: Mapping[str, Iterable[str]],
    checkpoint_format: CheckpointFormat,
) -> dict[str, Any]:
    """The checkpoint's `Data` as a JSON-ready dict of fresh lists, keys in the order Go marshals them."""
    pod_entries = [_entry(e, checkpoint_format) for e in entries]
    return {
        "PodDeviceEntries": pod_entries or None,
        "RegisteredDevices": {r: sorted(ids) for r, ids in sorted(registered.items())},
    }


def render_checkpoint(data: Mapping[str, Any]) -> bytes:
    """The file content: `Data` plus our `Checksum`, compact JSON."""
    document = {"Data": data, "Checksum": fnv32a(_canonical(data))}
    return json.dumps(document, separators=(",", ":")).encode()


def write_checkpoint(plugin_dir: Path, payload: bytes, *, durable: bool = True) -> Path:
    """Atomically replace `<plugin_dir>/kubelet_internal_checkpoint` with `payload`.

    With `durable`, the file and the directory are fsynced (as the kubelet's file store does).
    """
    target = plugin_dir / CHECKPOINT_FILE_NAME
    fd, tmp_name = tempfile.mkstemp(prefix=f".{CHECKPOINT_FILE_NAME}.", dir=plugin_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if durable:
        dir_fd = os.open(plugin_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target


def fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _entry(entry: ContainerDevices, checkpoint_format: CheckpointFormat) -> dict[str, Any]:
    device_ids: Any
    if checkpoint_format == "v1":
        device_ids = sorted(entry.device_ids)
    else:
        # Go's encoding/json sorts map keys as strings: "-1" < "0" < "1" < "10" < "2".
        device_ids = {key: sorted(ids) for key, ids in sorted(entry.numa)}
    alloc = entry.alloc_resp
    return {
        "PodUID": entry.pod_uid,
        "ContainerName": entry.container_name,
        "ResourceName": entry.resource_name,
        "DeviceIDs": device_ids,
        "AllocResp": base64.b64encode(alloc.SerializeToString()).decode() if alloc is not None else None,
    }


def _canonical(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
