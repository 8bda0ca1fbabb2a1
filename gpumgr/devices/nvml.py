"""The real backend, on nvidia-ml-py (`pynvml`). Nothing else in gpumgr imports pynvml.

Pairwise levels: NVLink first (links per pair counted from each link's remote PCI bus id; GPUs joined through
NVSwitches get NV<links>), else the PCIe common ancestor. NVML failures become one DiscoveryError whose message
says what to do.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
from types import ModuleType
from typing import Any

from gpumgr.devices.types import GPU, DiscoveryError, GPUStatus, HealthEvent, Inventory, ProcessUsage

_ANCESTOR_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class NvmlBackend:
    def __init__(self, nvml: ModuleType | None = None, library: str | None = None):
        self._nv = nvml if nvml is not None else _import_pynvml()
        if library:
            self._load_library(library)
        self._call(self._nv.nvmlInit, "initialise NVML")
        self._handles: list[Any] = []
        self._inv: Inventory | None = None
        self._events: Any = None
        self._last_sample: dict[int, int] = {}

    # -- Backend --------------------------------------------------------------------------------------------
    def inventory(self) -> Inventory:
        if self._inv is None:
            self._inv = self._discover()
        return self._inv

    def status(self, index: int) -> GPUStatus:
        nv, h = self._nv, self._handle(index)
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            util = nv.nvmlDeviceGetUtilizationRates(h).gpu
        except nv.NVMLError_GpuIsLost:
            return GPUStatus(index=index, lost=True)
        procs: dict[int, ProcessUsage] = {}
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                used = p.usedGpuMemory or 0
                procs[p.pid] = ProcessUsage(pid=p.pid, used_memory_bytes=int(used))
        except nv.NVMLError:
            pass
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, self._last_sample.get(index, 0))
            latest: dict[int, Any] = {}
            for s in samples:  # one value per pid: the newest sample (no double counting)
                if s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp:
                    latest[s.pid] = s
            for pid, s in latest.items():
                old = procs.get(pid, ProcessUsage(pid=pid))
                procs[pid] = ProcessUsage(pid=pid, used_memory_bytes=old.used_memory_bytes, sm_util=int(s.smUtil))
            if latest:
                self._last_sample[index] = max(s.timeStamp for s in latest.values())
        except nv.NVMLError:
            pass  # no samples yet, or not supported on this card
        return GPUStatus(index=index, used_memory_bytes=int(mem.used), utilization=int(util),
                         temperature_c=int(temp), processes=tuple(procs.values()))

    def wait_events(self, timeout_s: float) -> list[HealthEvent]:
        nv = self._nv
        if self._events is None:
            self._events = self._register_events()
        if self._events is False:
            import time

            time.sleep(timeout_s)
            return []
        out: list[HealthEvent] = []
        try:
            data = nv.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except nv.NVMLError_Timeout:
            return out
        except nv.NVMLError_GpuIsLost:
            return [HealthEvent(index=-1, kind="lost", detail="a GPU fell off the bus")]
        index = next((i for i, h in enumerate(self._handles) if h == data.device), -1)
        if data.eventType == nv.nvmlEventTypeXidCriticalError:
            out.append(HealthEvent(index=index, kind="xid", code=int(data.eventData)))
        elif data.eventType == nv.nvmlEventTypeDoubleBitEccError:
            out.append(HealthEvent(index=index, kind="ecc", code=1))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutting down is best effort
            self._nv.nvmlShutdown()

    # -- discovery ------------------------------------------------------------------------------------------
    def _discover(self) -> Inventory:
        nv = self._nv
        count = self._call(nv.nvmlDeviceGetCount, "count GPUs")
        self._handles = [self._call(nv.nvmlDeviceGetHandleByIndex, f"open GPU {i}", i) for i in range(count)]
        gpus = []
        bus_ids = []
        for i, h in enumerate(self._handles):
            pci = self._call(nv.nvmlDeviceGetPciInfo, f"read PCI info of GPU {i}", h)
            bus = _text(pci.busId).upper()
            bus_ids.append(_short_bus(bus))
            gpus.append(GPU(
                index=i,
                uuid=_text(self._call(nv.nvmlDeviceGetUUID, f"read UUID of GPU {i}", h)),
                minor=int(self._call(nv.nvmlDeviceGetMinorNumber, f"read minor of GPU {i}", h)),
                name=_text(self._call(nv.nvmlDeviceGetName, f"read name of GPU {i}", h)),
                memory_mib=int(self._call(nv.nvmlDeviceGetMemoryInfo, f"read memory of GPU {i}", h).total) >> 20,
                bus_id=bus,
                numa_node=self._numa(h),
            ))
        links = self._nvlinks(bus_ids)
        levels = [["X"] * count for _ in range(count)]
        for a, b in itertools.combinations(range(count), 2):
            n = links.get((a, b), 0)
            if n:
                level = f"NV{n}"
            else:
                anc = self._call(nv.nvmlDeviceGetTopologyCommonAncestor, f"read topology of GPU {a}-{b}",
                                 self._handles[a], self._handles[b])
                level = _ANCESTOR_LEVEL.get(int(anc), "SYS")
            levels[a][b] = levels[b][a] = level
        cuda = ""
        try:
            v = int(nv.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        except nv.NVMLError:
            pass
        return Inventory(
            gpus=tuple(gpus), levels=tuple(tuple(r) for r in levels),
            driver_version=_text(self._call(nv.nvmlSystemGetDriverVersion, "read the driver version")),
            cuda_driver_version=cuda,
        )

    def _nvlinks(self, bus_ids: list[str]) -> dict[tuple[int, int], int]:
        """Links per GPU pair; GPUs that both reach NVSwitches count as joined by min(their switch links)."""
        nv = self._nv
        by_bus = {b: i for i, b in enumerate(bus_ids)}
        pair: dict[tuple[int, int], int] = {}
        to_switch = [0] * len(self._handles)
        for i, h in enumerate(self._handles):
            for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    remote = _short_bus(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).upper())
                except nv.NVMLError:
                    continue  # no such link, or NVLink not supported on this card
                j = by_bus.get(remote)
                if j is not None and j != i:
                    key = (min(i, j), max(i, j))
                    pair[key] = pair.get(key, 0) + 1
                elif self._is_switch(h, link):
                    to_switch[i] += 1
        # each link is seen from both ends
        out = {k: max(1, v // 2) for k, v in pair.items()}
        for a, b in itertools.combinations(range(len(self._handles)), 2):
            if to_switch[a] and to_switch[b]:
                out[(a, b)] = max(out.get((a, b), 0), min(to_switch[a], to_switch[b]))
        return out

    def _is_switch(self, handle: Any, link: int) -> bool:
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if fn is None:
            return False
        try:
            return bool(fn(handle, link) == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        except nv.NVMLError:
            return False

    def _numa(self, handle: Any) -> int | None:
        fn = getattr(self._nv, "nvmlDeviceGetNumaNodeId", None)
        if fn is None:
            return None
        try:
            node = int(fn(handle))
        except self._nv.NVMLError:
            return None
        return node if node >= 0 else None

    def _register_events(self) -> Any:
        nv = self._nv
        try:
            es = nv.nvmlEventSetCreate()
            mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
            for h in self._handles:
                try:
                    nv.nvmlDeviceRegisterEvents(h, mask, es)
                except nv.NVMLError_NotSupported:
                    continue
            return es
        except nv.NVMLError:
            return False

    def _load_library(self, path: str) -> None:
        """Use this libnvidia-ml.so.1 (pynvml loads `nvmlLib` once, from the loader's path, unless it is set)."""
        import ctypes

        try:
            setattr(self._nv, "nvmlLib", ctypes.CDLL(path))  # noqa: B010 - pynvml has no setter
        except OSError as e:
            raise DiscoveryError(f"cannot load the NVML library {path}: {e}") from None

    def _handle(self, index: int) -> Any:
        if not self._handles:
            self.inventory()
        return self._handles[index]

    def _call(self, fn: Any, what: str, *args: Any) -> Any:
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError_LibraryNotFound:
            raise DiscoveryError(
                f"cannot {what}: the NVML library (libnvidia-ml.so.1) was not found; install the NVIDIA driver "
                "and mount its libraries into this container"
            ) from None
        except nv.NVMLError_DriverNotLoaded:
            raise DiscoveryError(
                f"cannot {what}: the NVIDIA kernel driver is not loaded (check `lsmod | grep nvidia`)"
            ) from None
        except nv.NVMLError_NoPermission:
            raise DiscoveryError(
                f"cannot {what}: no permission to use NVML; run the agent privileged with /dev mounted"
            ) from None
        except nv.NVMLError as e:
            raise DiscoveryError(f"cannot {what}: NVML error: {e}") from None


def _import_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise DiscoveryError("nvidia-ml-py (module pynvml) is not installed: pip install nvidia-ml-py") from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _short_bus(bus: str) -> str:
    """Bus ids come with an 8- or 4-digit domain; compare them on the last `bb:dd.f` part plus domain digits."""
    head = bus.split(":")
    if len(head) == 3:
        return f"{int(head[0], 16):04X}:{head[1]}:{head[2]}"
    return bus
