"""The protobuf code in gpumgr/pb is what proto/*.proto generate, and the device-plugin API has the upstream
field names and numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumgr.pb import deviceplugin_pb2 as dp
from gpumgr.pb import dra_pb2 as dra
from gpumgr.pb import drahealth_pb2 as drah
from gpumgr.pb import pluginregistration_pb2 as reg
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
    (vd.DeviceLimit, {"uuid": 1, "index": 2, "memory_limit_bytes": 3, "compute": 4}),
    (vd.RegisterResponse, {"devices": 1, "core_limit": 2, "hard_limit": 3, "core_ceiling": 4, "host_pid": 5}),
    (dra.NodePrepareResourcesRequest, {"claims": 1}),
    (dra.NodePrepareResourcesResponse, {"claims": 1}),
    (dra.NodePrepareResourceResponse, {"devices": 1, "error": 2}),
    (dra.Device, {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}),
    (dra.NodeUnprepareResourcesRequest, {"claims": 1}),
    (dra.NodeUnprepareResourcesResponse, {"claims": 1}),
    (dra.NodeUnprepareResourceResponse, {"error": 1}),
    (dra.Claim, {"namespace": 1, "uid": 2, "name": 3}),
    (reg.PluginInfo, {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}),
    (reg.RegistrationStatus, {"plugin_registered": 1, "error": 2}),
    (reg.RegistrationStatusResponse, {}),
    (reg.InfoRequest, {}),
    (drah.NodeWatchResourcesRequest, {}),
    (drah.NodeWatchResourcesResponse, {"devices": 1}),
    (drah.DeviceIdentifier, {"pool_name": 1, "device_name": 2}),
    (drah.DeviceHealth, {"device": 1, "health": 2, "last_updated_time": 3, "health_check_timeout_seconds": 4,
                         "message": 5}),
])
def test_field_names_and_numbers(message, want):
    assert fields(message) == want


def test_service_paths():
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert [m.name for m in dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    assert dp.DESCRIPTOR.services_by_name["Registration"].methods[0].name == "Register"
    assert vd.DESCRIPTOR.services_by_name["VDevice"].full_name == "gpumgr.vdevice.v1.VDevice"


def test_dra_service_paths():
    plugin = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert plugin.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in plugin.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    # the response maps are keyed by claim UID
    entry = dra.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"].message_type
    assert entry.GetOptions().map_entry and entry.fields_by_name["key"].type == entry.fields_by_name["key"].TYPE_STRING
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
    assert [m.name for m in registration.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    health = drah.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert health.full_name == "v1alpha1.DRAResourceHealth"
    assert health.methods[0].name == "NodeWatchResources" and health.methods[0].server_streaming
    assert {v.name: v.number for v in drah.HealthStatus.DESCRIPTOR.values} == {
        "UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
