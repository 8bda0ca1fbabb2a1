"""A kubelet emulator: the kubelet side of the device-plugin API v1beta1 over real unix sockets, with
pod admission and a real-format `kubelet_internal_checkpoint`."""

from gpumgr.sim.kubelet.admission import AdmissionError, AdmittedPod, ContainerAllocation, ContainerRequest
from gpumgr.sim.kubelet.emulator import KubeletEmulator, cleanup_plugin_directory
from gpumgr.sim.kubelet.manager import RejectedRegistration
from gpumgr.sim.kubelet.protocol import (
    API_VERSION,
    HEALTHY,
    KUBELET_SOCKET_NAME,
    UNHEALTHY,
    is_extended_resource_name,
)

__all__ = [
    "API_VERSION",
    "HEALTHY",
    "KUBELET_SOCKET_NAME",
    "UNHEALTHY",
    "AdmissionError",
    "AdmittedPod",
    "ContainerAllocation",
    "ContainerRequest",
    "KubeletEmulator",
    "RejectedRegistration",
    "cleanup_plugin_directory",
    "is_extended_resource_name",
]
