"""The protobuf code in gpumgr/pb is what proto/*.proto generate, and the device-plugin API has the upstream
field names and numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumgr.pb import deviceplugin_pb2 as dp
from gpumgr.pb import vdevice_pb2 as vd

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_current(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto").glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Igpumgr/pb=proto", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", f"--mypy_out={tmp_path}", *protos],
                   cwd=ROOT, check=True, env=env, capture_output=True)
    generated = sorted((tmp_path / "gpumgr" / "pb").iterdir())
    assert generated, "protoc produced nothing"
    for f in generated:
        committed = ROOT / "gpumgr" / "pb" / f.name
        assert committed.exists(), f"{committed} is missing: run `make proto`"
        assert committed.read_text() == f.read_text(), f"{committed} is stale: run `make proto`"


def fields(message) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


@pytest.mark.parametrize(("message", "want"), [
    (dp.DevicePluginOptions, {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
    (dp.RegisterRequest, {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
    (dp.Device, {"ID": 1, "health": 2, "topology": 3}),
    (dp.NUMANode, {"ID": 1}),
    (dp.ContainerPreferredAllocationRequest,
     {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}),
    (dp.ContainerPreferredAllocationResponse, {"deviceIDs": 1}),
    (dp.ContainerAllocateRequest, {"devices_ids": 1}),
    (dp.ContainerAllocateResponse, {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}),
    (dp.Mount, {"container_path": 1, "host_path": 2, "read_only": 3}),
    (dp.DeviceSpec, {"container_path": 1, "host_path": 2, "permissions": 3}),
    (dp.CDIDevice, {"name": 1}),
    (dp.PreStartContainerRequest, {"devices_ids": 1}),
    (vd.RegisterRequest, {"pod_uid": 1, "container_name": 2, "container_id": 3, "pid": 4, "bus_ids": 5}),
    (vd.DeviceLimit, {"uuid": 1, "index": 2, "memory_limit_bytes": 3}),
    (vd.RegisterResponse, {"devices": 1, "core_limit": 2, "hard_limit": 3, "core_ceiling": 4, "host_pid": 5}),
])
def test_field_names_and_numbers(message, want):
    assert fields(message) == want


def test_service_paths():
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert [m.name for m in dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    assert dp.DESCRIPTOR.services_by_name["Registration"].methods[0].name == "Register"
    assert vd.DESCRIPTOR.services_by_name["VDevice"].full_name == "gpumgr.vdevice.v1.VDevice"
