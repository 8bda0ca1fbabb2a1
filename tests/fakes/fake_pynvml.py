"""A stand-in for the `pynvml` module (nvidia-ml-py): the same function names, constants and error classes,
answering for a small made-up node. Used to test the real NVML backend without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_FEATURE_ENABLED = 1
NVML_FEATURE_DISABLED = 0
NVML_NVLINK_MAX_LINKS = 6
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_TEMPERATURE_GPU = 0
nvmlEventTypeXidCriticalError = 8
nvmlEventTypeDoubleBitEccError = 2


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    pass


class NVMLError_NoPermission(NVMLError):  # noqa: N801
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


@dataclass
class FakeGPU:
    uuid: str
    minor: int
    name: str
    memory_mib: int
    bus: str
    numa: int = 0
    links: dict[int, str] = field(default_factory=dict)  # link number -> remote bus id
    switch_links: set[int] = field(default_factory=set)


class FakeNode:
    """Configure, then `install()` returns a module-like object."""

    def __init__(self, gpus: list[FakeGPU], ancestors: dict[tuple[int, int], int], init_error: type | None = None):
        self.gpus = gpus
        self.ancestors = ancestors
        self.init_error = init_error
        self.events: list[Any] = []

    def module(self) -> SimpleNamespace:
        node = self
        ns = SimpleNamespace(**{k: v for k, v in globals().items() if k.startswith(("NVML", "nvmlEventType"))})

        def init() -> None:
            if node.init_error:
                raise node.init_error()

        def handle(i: int) -> int:
            if not 0 <= i < len(node.gpus):
                raise NVMLError("invalid argument")
            return i

        def link_state(h: int, link: int) -> int:
            g = node.gpus[h]
            if link in g.links or link in g.switch_links:
                return NVML_FEATURE_ENABLED
            if link >= 4:
                raise NVMLError_NotSupported()
            return NVML_FEATURE_DISABLED

        def remote_pci(h: int, link: int) -> Any:
            g = node.gpus[h]
            bus = g.links.get(link, "00000000:FF:00.0")
            return SimpleNamespace(busId=bus.encode())

        def remote_type(h: int, link: int) -> int:
            return NVML_NVLINK_DEVICE_TYPE_SWITCH if link in node.gpus[h].switch_links else NVML_NVLINK_DEVICE_TYPE_GPU

        def event_wait(es: Any, timeout_ms: int) -> Any:
            if not node.events:
                raise NVMLError_Timeout()
            return node.events.pop(0)

        ns.nvmlInit = init
        ns.nvmlShutdown = lambda: None
        ns.nvmlDeviceGetCount = lambda: len(node.gpus)
        ns.nvmlDeviceGetHandleByIndex = handle
        ns.nvmlDeviceGetUUID = lambda h: node.gpus[h].uuid
        ns.nvmlDeviceGetMinorNumber = lambda h: node.gpus[h].minor
        ns.nvmlDeviceGetName = lambda h: node.gpus[h].name.encode()
        ns.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=node.gpus[h].memory_mib << 20, used=1 << 20)
        ns.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=node.gpus[h].bus)
        ns.nvmlDeviceGetNumaNodeId = lambda h: node.gpus[h].numa
        ns.nvmlSystemGetDriverVersion = lambda: "550.54.15"
        ns.nvmlSystemGetCudaDriverVersion = lambda: 12040
        ns.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: node.ancestors[(min(a, b), max(a, b))]
        ns.nvmlDeviceGetNvLinkState = link_state
        ns.nvmlDeviceGetNvLinkRemotePciInfo = remote_pci
        ns.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type
        ns.nvmlDeviceGetTemperature = lambda h, kind: 45
        ns.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=10, memory=5)
        ns.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(pid=100 + h, usedGpuMemory=256 << 20)]
        ns.nvmlDeviceGetProcessUtilization = lambda h, ts: [
            SimpleNamespace(pid=100 + h, smUtil=30, timeStamp=5), SimpleNamespace(pid=100 + h, smUtil=40, timeStamp=9)
        ]
        ns.nvmlEventSetCreate = lambda: object()
        ns.nvmlDeviceRegisterEvents = lambda h, mask, es: None
        ns.nvmlEventSetWait_v2 = event_wait
        for name, value in globals().items():
            if name.startswith("NVMLError"):
                setattr(ns, name, value)
        return ns
