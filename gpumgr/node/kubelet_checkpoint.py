"""Read the kubelet's device-manager checkpoint (`kubelet_internal_checkpoint`). Never writes it.

The kubelet records, per pod, container and extended resource, the device IDs it handed out and the
plugin's serialized ContainerAllocateResponse. Two layouts exist for an entry's `DeviceIDs`:

- v2 (kubelet >= 1.20): an object keyed by NUMA node ID as a string (`"0"`, `"-1"` for "no topology"),
  each value a list of device IDs; a device with several NUMA nodes is listed under each of them;
- v1 (older kubelets): a flat list of device IDs.

`Checksum` is FNV-32a over Go's spew output of `Data` and cannot be reproduced outside Go, so it is
never verified here. A missing file is an empty checkpoint; anything unparsable raises
`KubeletCheckpointError` naming the file and the offending key.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

from google.protobuf.message import DecodeError

from gpumgr.pb.deviceplugin_pb2 import ContainerAllocateResponse

CHECKPOINT_FILE_NAME = "kubelet_internal_checkpoint"
NUMA_WITHOUT_TOPOLOGY = "-1"

Layout = Literal["v1", "v2"]


class KubeletCheckpointError(Exception):
    """The kubelet checkpoint exists but cannot be read or parsed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"kubelet checkpoint {path}: {reason}")
        self.path = path
        self.reason = reason


def read_kubelet_checkpoint(path: Path | str) -> KubeletCheckpoint:
    """Read `path` (the checkpoint file, or the device-plugin directory that holds it).

    A missing file gives an empty `KubeletCheckpoint`.
    """
    target = Path(path)
    if target.is_dir():
        target = target / CHECKPOINT_FILE_NAME
    try:
        raw = target.read_bytes()
    except FileNotFoundError:
        return KubeletCheckpoint(entries=(), registered_devices={}, layout=None)
    except OSError as exc:
        raise KubeletCheckpointError(str(target), f"cannot read: {exc.strerror or exc}") from exc
    return parse_kubelet_checkpoint(raw, source=str(target))


def parse_kubelet_checkpoint(raw: bytes | str, source: str = "<memory>") -> KubeletCheckpoint:
    """Parse checkpoint JSON text; `source` names it in errors."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise KubeletCheckpointError(source, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    if not text.strip():
        raise KubeletCheckpointError(source, "file is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KubeletCheckpointError(
            source, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    return _CheckpointParser(source).parse(doc)


def find_owners(
    entries: Iterable[PodDeviceEntry], resource_name: str, device_ids: Iterable[str]
) -> list[tuple[str, str]]:
    """Every distinct (pod_uid, container_name) whose entry for `resource_name` holds exactly `device_ids`.

    Order of the IDs does not matter; a subset or superset does not match. More than one owner occurs
    when an app container reuses all of an init container's devices.
    """
    wanted = frozenset(device_ids)
    owners: list[tuple[str, str]] = []
    if not wanted:
        return owners
    for entry in entries:
        if entry.resource_name != resource_name or frozenset(entry.device_ids) != wanted:
            continue
        owner = (entry.pod_uid, entry.container_name)
        if owner not in owners:
            owners.append(owner)
    return owners


def find_owner(
    entries: Iterable[PodDeviceEntry], resource_name: str, device_ids: Iterable[str]
) -> tuple[str, str] | None:
    """The single (pod_uid, container_name) holding exactly `device_ids` of `resource_name`.

    None when no entry matches, or when several containers match (ambiguous: use `find_owners`).
    """
    owners = find_owners(entries, resource_name, device_ids)
    return owners[0] if len(owners) == 1 else None


class _CheckpointParser:
    """Turns the decoded JSON document into typed entries, naming the file and key on any error."""

    def __init__(self, source: str) -> None:
        self._source = source

    def parse(self, doc: Any) -> KubeletCheckpoint:
        if not isinstance(doc, dict):
            self._fail("top level", f"expected an object, got {_kind(doc)}")
        data = doc.get("Data")
        if not isinstance(data, dict):
            self._fail("Data", "missing" if data is None else f"expected an object, got {_kind(data)}")
        raw_entries = data.get("PodDeviceEntries")
        if raw_entries is None:
            raw_entries = []
        if not isinstance(raw_entries, list):
            self._fail("Data.PodDeviceEntries", f"expected a list, got {_kind(raw_entries)}")
        entries: list[PodDeviceEntry] = []
        layouts: set[Layout] = set()
        for index, raw in enumerate(raw_entries):
            entry, layout = self._entry(f"Data.PodDeviceEntries[{index}]", raw)
            entries.append(entry)
            if layout is not None:
                layouts.add(layout)
        if len(layouts) > 1:
            self._fail("Data.PodDeviceEntries", "mixes the flat (v1) and NUMA-keyed (v2) DeviceIDs layouts")
        checksum = doc.get("Checksum")
        boot_id = doc.get("BootID")
        return KubeletCheckpoint(
            entries=tuple(entries),
            registered_devices=self._registered(data.get("RegisteredDevices")),
            layout=layouts.pop() if layouts else None,
            checksum=checksum if isinstance(checksum, int) and not isinstance(checksum, bool) else None,
            boot_id=boot_id if isinstance(boot_id, str) and boot_id else None,
        )

    def _entry(self, where: str, raw: Any) -> tuple[PodDeviceEntry, Layout | None]:
        if not isinstance(raw, dict):
            self._fail(where, f"expected an object, got {_kind(raw)}")
        pod_uid = self._string(f"{where}.PodUID", raw.get("PodUID"), required=True)
        container = self._string(f"{where}.ContainerName", raw.get("ContainerName"), required=True)
        resource = self._string(f"{where}.ResourceName", raw.get("ResourceName"), required=True)
        ids_raw = raw.get("DeviceIDs")
        layout: Layout | None
        numa: list[tuple[str, tuple[str, ...]]] = []
        if ids_raw is None:
            layout = None
        elif isinstance(ids_raw, list):
            layout = "v1"
            numa.append((NUMA_WITHOUT_TOPOLOGY, self._id_list(f"{where}.DeviceIDs", ids_raw)))
        elif isinstance(ids_raw, dict):
            layout = "v2"
            for key, ids in ids_raw.items():
                if not _is_numa_key(key):
                    self._fail(f"{where}.DeviceIDs", f"NUMA key {key!r} is not an integer")
                numa.append((key, self._id_list(f"{where}.DeviceIDs[{key!r}]", ids)))
        else:
            self._fail(f"{where}.DeviceIDs", f"expected a list or an object, got {_kind(ids_raw)}")
        flat: list[str] = []
        for _key, ids in numa:
            flat.extend(i for i in ids if i not in flat)
        entry = PodDeviceEntry(
            pod_uid=pod_uid,
            container_name=container,
            resource_name=resource,
            device_ids=tuple(flat),
            alloc_resp=self._alloc_resp(f"{where}.AllocResp", raw.get("AllocResp")),
            numa_device_ids=tuple(numa),
        )
        return entry, layout

    def _alloc_resp(self, where: str, raw: Any) -> ContainerAllocateResponse | None:
        if raw is None:
            return None
        if not isinstance(raw, str):
            self._fail(where, f"expected a base64 string, got {_kind(raw)}")
        try:
            blob = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            self._fail(where, f"not valid base64 ({exc})")
        try:
            return ContainerAllocateResponse.FromString(blob)
        except DecodeError as exc:
            self._fail(where, f"not a serialized ContainerAllocateResponse ({exc})")

    def _registered(self, raw: Any) -> dict[str, tuple[str, ...]]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self._fail("Data.RegisteredDevices", f"expected an object, got {_kind(raw)}")
        return {
            str(resource): self._id_list(f"Data.RegisteredDevices[{resource!r}]", ids)
            for resource, ids in raw.items()
        }

    def _id_list(self, where: str, raw: Any) -> tuple[str, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self._fail(where, f"expected a list of device IDs, got {_kind(raw)}")
        for index, item in enumerate(raw):
            if not isinstance(item, str) or not item:
                self._fail(f"{where}[{index}]", f"expected a non-empty string, got {_kind(item)}")
        return tuple(raw)

    def _string(self, where: str, raw: Any, *, required: bool) -> str:
        if not isinstance(raw, str):
            self._fail(where, "missing" if raw is None else f"expected a string, got {_kind(raw)}")
        if required and not raw:
            self._fail(where, "is empty")
        return raw

    def _fail(self, where: str, reason: str) -> NoReturn:
        raise KubeletCheckpointError(self._source, f"{where}: {reason}")


def _is_numa_key(key: str) -> bool:
    try:
        int(key)
    except ValueError:
        return False
    return True


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


@dataclass(frozen=True)
class PodDeviceEntry:
    """One (pod, container, resource) record of the kubelet checkpoint.

    `device_ids` is the distinct IDs in file order; `numa_device_ids` keeps the file's grouping as
    (NUMA key, IDs) pairs (v1 files group everything under "-1", as the kubelet does when converting).
    `alloc_resp` is None when the file has no AllocResp.
    """

    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: tuple[str, ...]
    alloc_resp: ContainerAllocateResponse | None = field(default=None, hash=False)
    numa_device_ids: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class KubeletCheckpoint:
    """The parsed file: entries, the healthy devices registered per resource, and what layout it used.

    `layout` is None when the file is missing or has no entry that shows it.
    """

    entries: tuple[PodDeviceEntry, ...]
    registered_devices: Mapping[str, tuple[str, ...]] = field(hash=False)
    layout: Layout | None = None
    checksum: int | None = None
    boot_id: str | None = None

    def entries_for_pod(self, pod_uid: str) -> list[PodDeviceEntry]:
        return [e for e in self.entries if e.pod_uid == pod_uid]
