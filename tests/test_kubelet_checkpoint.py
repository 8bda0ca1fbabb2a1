"""Reading the kubelet's `kubelet_internal_checkpoint` (both layouts) and mapping device IDs to owners."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from gpumgr.node.kubelet_checkpoint import (
    CHECKPOINT_FILE_NAME,
    KubeletCheckpointError,
    PodDeviceEntry,
    find_owner,
    find_owners,
    read_kubelet_checkpoint,
)

CORE = "tencent.com/vcuda-core"
MEM = "tencent.com/vcuda-memory"
# ContainerAllocateResponse{envs={NVIDIA_VISIBLE_DEVICES: GPU-8a1c},
#                           devices=[/dev/nvidia0 -> /dev/nvidia0 "rw"]}
ALLOC_RESP = (
    "CiIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSCEdQVS04YTFjGiAKDC9kZXYvbnZpZGlhMBIML2Rldi9udmlkaWEwGgJydw=="
)

# Shaped like a kubelet >= 1.20 file: compact JSON, NUMA-keyed DeviceIDs, BootID outside Data.
V2_SAMPLE = (
    '{"Data":{"PodDeviceEntries":['
    '{"PodUID":"7d0c0f3e-5c1e-4d7a-9d0e-2f4a9b1c8e11","ContainerName":"trainer","ResourceName":"'
    + CORE
    + '",'
    '"DeviceIDs":{"-1":["vcore-2-00"],"0":["vcore-0-00","vcore-0-01"]},"AllocResp":"' + ALLOC_RESP + '"},'
    '{"PodUID":"7d0c0f3e-5c1e-4d7a-9d0e-2f4a9b1c8e11","ContainerName":"trainer","ResourceName":"' + MEM + '",'
    '"DeviceIDs":{"0":["vmem-0-03"]},"AllocResp":""},'
    '{"PodUID":"0b9a7c55-1111-4e0f-8a2b-3c4d5e6f7a8b","ContainerName":"sidecar","ResourceName":"'
    + CORE
    + '",'
    '"DeviceIDs":{"1":["vcore-1-07"]},"AllocResp":null}'
    '],"RegisteredDevices":{"' + CORE + '":["vcore-0-00","vcore-0-01","vcore-1-07","vcore-2-00"],'
    '"' + MEM + '":["vmem-0-03"]}},"Checksum":3120447683,"BootID":"5f1b0c9e-boot"}'
)

V1_SAMPLE = json.dumps(
    {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": "uid-a",
                    "ContainerName": "main",
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": ["GPU-2", "GPU-1"],
                    "AllocResp": ALLOC_RESP,
                },
            ],
            "RegisteredDevices": {"nvidia.com/gpu": ["GPU-1", "GPU-2", "GPU-3"]},
        },
        "Checksum": 12345,
    }
)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / CHECKPOINT_FILE_NAME
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_reads_numa_keyed_layout(tmp_path: Path):
    path = write(tmp_path, V2_SAMPLE)
    checkpoint = read_kubelet_checkpoint(path)
    assert checkpoint.layout == "v2"
    assert checkpoint.checksum == 3120447683
    assert checkpoint.boot_id == "5f1b0c9e-boot"
    core, mem, sidecar = checkpoint.entries
    assert (core.pod_uid, core.container_name, core.resource_name) == (
        "7d0c0f3e-5c1e-4d7a-9d0e-2f4a9b1c8e11",
        "trainer",
        CORE,
    )
    assert core.device_ids == ("vcore-2-00", "vcore-0-00", "vcore-0-01")
    assert core.numa_device_ids == (("-1", ("vcore-2-00",)), ("0", ("vcore-0-00", "vcore-0-01")))
    assert core.alloc_resp is not None
    assert dict(core.alloc_resp.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-8a1c"}
    assert [(d.container_path, d.host_path, d.permissions) for d in core.alloc_resp.devices] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw")
    ]
    assert mem.device_ids == ("vmem-0-03",)
    assert mem.alloc_resp is not None and mem.alloc_resp.ByteSize() == 0  # "" is an empty response
    assert sidecar.alloc_resp is None  # null means none recorded
    assert checkpoint.registered_devices == {
        CORE: ("vcore-0-00", "vcore-0-01", "vcore-1-07", "vcore-2-00"),
        MEM: ("vmem-0-03",),
    }
    assert [e.container_name for e in checkpoint.entries_for_pod("0b9a7c55-1111-4e0f-8a2b-3c4d5e6f7a8b")] == [
        "sidecar"
    ]


def test_reads_flat_pre_1_20_layout(tmp_path: Path):
    checkpoint = read_kubelet_checkpoint(write(tmp_path, V1_SAMPLE))
    assert checkpoint.layout == "v1"
    (entry,) = checkpoint.entries
    assert entry.device_ids == ("GPU-2", "GPU-1")
    assert entry.numa_device_ids == (("-1", ("GPU-2", "GPU-1")),)
    assert entry.alloc_resp is not None and entry.alloc_resp.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-8a1c"
    assert checkpoint.registered_devices == {"nvidia.com/gpu": ("GPU-1", "GPU-2", "GPU-3")}


def test_device_under_several_numa_nodes_is_listed_once(tmp_path: Path):
    doc = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": "u",
                    "ContainerName": "c",
                    "ResourceName": CORE,
                    "DeviceIDs": {"0": ["x", "y"], "1": ["y"]},
                    "AllocResp": None,
                }
            ],
            "RegisteredDevices": {},
        },
        "Checksum": 1,
    }
    (entry,) = read_kubelet_checkpoint(write(tmp_path, json.dumps(doc))).entries
    assert entry.device_ids == ("x", "y")


def test_accepts_the_plugin_directory(tmp_path: Path):
    write(tmp_path, V2_SAMPLE)
    assert len(read_kubelet_checkpoint(tmp_path).entries) == 3


def test_missing_file_is_empty(tmp_path: Path):
    checkpoint = read_kubelet_checkpoint(tmp_path / CHECKPOINT_FILE_NAME)
    assert (
        checkpoint.entries == () and dict(checkpoint.registered_devices) == {} and checkpoint.layout is None
    )
    assert read_kubelet_checkpoint(tmp_path).entries == ()


def test_null_lists_are_empty(tmp_path: Path):
    path = write(tmp_path, '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}')
    checkpoint = read_kubelet_checkpoint(path)
    assert checkpoint.entries == () and dict(checkpoint.registered_devices) == {}


def test_reading_changes_nothing(tmp_path: Path):
    path = write(tmp_path, V2_SAMPLE)
    os.chmod(path, 0o444)
    before = (path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path)))
    read_kubelet_checkpoint(path)
    assert (path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path))) == before


def entry_doc(**overrides: object) -> str:
    entry: dict[str, object] = {
        "PodUID": "u",
        "ContainerName": "c",
        "ResourceName": CORE,
        "DeviceIDs": {"0": ["a"]},
        "AllocResp": ALLOC_RESP,
    }
    entry.update(overrides)
    return json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 1})


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (V2_SAMPLE[: len(V2_SAMPLE) // 2], "invalid JSON"),
        (b"\x00\x01garbage\xff", "UTF-8"),
        ("not json at all", "invalid JSON"),
        ("", "empty"),
        ("[1, 2]", "top level"),
        ('{"Checksum": 1}', "Data"),
        ('{"Data": {"PodDeviceEntries": {}}}', "PodDeviceEntries"),
        ('{"Data": {"PodDeviceEntries": [], "RegisteredDevices": []}}', "RegisteredDevices"),
        ('{"Data": {"PodDeviceEntries": [], "RegisteredDevices": {"r": [1]}}}', "RegisteredDevices"),
        ('{"Data": {"PodDeviceEntries": ["x"]}}', "PodDeviceEntries[0]"),
        (entry_doc(PodUID=None), "PodUID"),
        (entry_doc(ContainerName=7), "ContainerName"),
        (entry_doc(ResourceName=""), "ResourceName"),
        (entry_doc(DeviceIDs=5), "DeviceIDs"),
        (entry_doc(DeviceIDs={"zero": ["a"]}), "NUMA key"),
        (entry_doc(DeviceIDs={"0": [1]}), "DeviceIDs"),
        (entry_doc(DeviceIDs={"0": "a"}), "DeviceIDs"),
        (entry_doc(AllocResp="%%%not-base64"), "base64"),
        (entry_doc(AllocResp=base64.b64encode(b"\xff\xff\xff").decode()), "ContainerAllocateResponse"),
        (entry_doc(AllocResp=42), "AllocResp"),
    ],
)
def test_corrupt_checkpoint_raises_naming_the_file(tmp_path: Path, content: str | bytes, expected: str):
    path = write(tmp_path, content)
    with pytest.raises(KubeletCheckpointError) as err:
        read_kubelet_checkpoint(path)
    assert err.value.path == str(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_mixed_layouts_are_rejected(tmp_path: Path):
    doc = json.loads(V1_SAMPLE)
    doc["Data"]["PodDeviceEntries"].append(
        {
            "PodUID": "u",
            "ContainerName": "c",
            "ResourceName": "r",
            "DeviceIDs": {"0": ["x"]},
            "AllocResp": None,
        }
    )
    with pytest.raises(KubeletCheckpointError, match="mixes"):
        read_kubelet_checkpoint(write(tmp_path, json.dumps(doc)))


def test_unreadable_path_raises(tmp_path: Path):
    path = tmp_path / CHECKPOINT_FILE_NAME
    path.mkdir()
    (path / CHECKPOINT_FILE_NAME).mkdir()  # a directory where the file should be
    with pytest.raises(KubeletCheckpointError) as err:
        read_kubelet_checkpoint(path)
    assert CHECKPOINT_FILE_NAME in str(err.value)


# -- find_owner ------------------------------------------------------------------------------------

ENTRIES = (
    PodDeviceEntry("pod-a", "main", CORE, ("c1", "c2", "c3")),
    PodDeviceEntry("pod-a", "main", MEM, ("m1", "m2")),
    PodDeviceEntry("pod-b", "main", CORE, ("c4",)),
    PodDeviceEntry("pod-c", "init", CORE, ("c5", "c6")),
    PodDeviceEntry("pod-c", "app", CORE, ("c6", "c5")),
)


def test_find_owner_matches_the_exact_set_in_any_order():
    assert find_owner(ENTRIES, CORE, ["c3", "c1", "c2"]) == ("pod-a", "main")
    assert find_owner(ENTRIES, CORE, ("c4",)) == ("pod-b", "main")
    assert find_owner(ENTRIES, MEM, {"m2", "m1"}) == ("pod-a", "main")


@pytest.mark.parametrize(
    ("resource", "ids"),
    [
        (CORE, ["c1", "c2"]),  # subset
        (CORE, ["c1", "c2", "c3", "c4"]),  # superset
        (CORE, ["c3", "c4"]),  # spans two owners
        (MEM, ["c1", "c2", "c3"]),  # right IDs, wrong resource
        (CORE, []),
        (CORE, ["zz"]),
    ],
)
def test_find_owner_rejects_partial_matches(resource: str, ids: list[str]):
    assert find_owner(ENTRIES, resource, ids) is None
    assert find_owners(ENTRIES, resource, ids) == []


def test_find_owner_is_none_when_ambiguous_and_find_owners_lists_all():
    assert find_owner(ENTRIES, CORE, ["c5", "c6"]) is None
    assert find_owners(ENTRIES, CORE, ["c6", "c5"]) == [("pod-c", "init"), ("pod-c", "app")]


def test_find_owner_on_a_read_checkpoint(tmp_path: Path):
    entries = read_kubelet_checkpoint(write(tmp_path, V2_SAMPLE)).entries
    owner = find_owner(entries, CORE, ["vcore-0-01", "vcore-2-00", "vcore-0-00"])
    assert owner == ("7d0c0f3e-5c1e-4d7a-9d0e-2f4a9b1c8e11", "trainer")
    assert find_owner(entries, CORE, ["vcore-0-00", "vcore-0-01"]) is None
