"""The real backend, on nvidia-ml-py (`pynvml`). Nothing else in gpumgr imports pynvml.

Pairwise levels: NVLink first (links per pair counted from each link's remote PCI bus id; GPUs joined through
NVSwitches get NV<links>), else the PCIe common ancestor. NVML failures during discovery become one
DiscoveryError whose message says what to do.

Drivers differ in which entry points they have (see docs/health-and-labels.md, "Driver versions"). Each newer
call falls back to the older one it replaced, or, when there is none, to a logged loss of that one feature:
  running processes   ..._v3 -> ..._v2 -> the unversioned v1 call -> no per-process memory
                      (..._v2 first on 535.43-535.86, whose ..._v3 fills a struct nvidia-ml-py does not read)
  event wait          nvmlEventSetWait_v2 -> nvmlEventSetWait -> no XID/ECC events (ECC counters still polled)
  event types         XID + double-bit ECC, masked by nvmlDeviceGetSupportedEventTypes (ECC off: XID only);
                      without that call: both, then XID alone if NVML refuses
  NVSwitch links      nvmlDeviceGetNvLinkRemoteDeviceType -> the remote's PCI vendor (NVIDIA, not a GPU = switch)
NUMA node: the PCI device's `numa_node` in sysfs (what the kubelet reads), else NVML's memory affinity.
A card that read as lost and reads again has been reset: the next `wait_events` reports it "recovered".
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import itertools
import logging
import queue
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from gpumgr.devices import mig_nvml
from gpumgr.devices.arch import gpm_by_architecture
from gpumgr.devices.types import GPU, DiscoveryError, GPUStatus, HealthEvent, Inventory, ProcessUsage
from gpumgr.mig.profiles import family_of
from gpumgr.mig.types import MigCard, MigError, MigInstance
from gpumgr.requests.podspec import ascii_uint

log = logging.getLogger("gpumgr.devices.nvml")

_ANCESTOR_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVIDIA_PCI_VENDOR = 0x10DE
_NUMA_NODE_WORDS = 16  # 16 x 64 = 1024 NUMA nodes in the affinity mask
_PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                  "nvmlDeviceGetComputeRunningProcesses")
_WAIT_CALLS = ("nvmlEventSetWait_v2", "nvmlEventSetWait")
_MAX_PROCESSES = 4096  # bound on one card's process list
_NO_INSTANCE = 0xFFFFFFFF  # an event's gpuInstanceId when it concerns the whole card
_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE in an unsigned long long field


class NvmlBackend:
    def __init__(self, nvml: ModuleType | None = None, library: str | None = None, sysfs_root: str = "/sys"):
        self._nv = nvml if nvml is not None else _import_pynvml()
        self._sysfs = Path(sysfs_root)
        if library:
            self._load_library(library)
        self._call(self._nv.nvmlInit, "initialise NVML")
        self._handles: list[Any] = []
        self._handle_keys: list[Any] = []
        self._inv: Inventory | None = None
        self._events: Any = None
        self._last_sample: dict[int, int] = {}
        self._process_call = 0  # index into _PROCESS_CALLS of the newest call this driver has
        self._wait_call = 0  # index into _WAIT_CALLS
        self._no_remote_type = False
        self._no_ecc: set[int] = set()
        self._lost: set[int] = set()  # cards whose last status read found them off the bus
        self._recovered: queue.SimpleQueue[HealthEvent] = queue.SimpleQueue()  # status thread -> event thread

    # -- Backend --------------------------------------------------------------------------------------------
    def inventory(self) -> Inventory:
        if self._inv is None:
            self._inv = self._discover()
            if _v3_struct_differs(self._inv.driver_version):
                self._process_call = 1
                log.info("driver %s fills nvmlDeviceGetComputeRunningProcesses_v3 with a struct nvidia-ml-py does "
                         "not read: using ..._v2", self._inv.driver_version)
            # Register for events now: NVML queues what happens from here on, so none is lost before the
            # first wait.
            self._events = self._register_events()
        return self._inv

    def status(self, index: int) -> GPUStatus:
        nv, h = self._nv, self._handle(index)
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            util = self._utilization(h)
        except nv.NVMLError_GpuIsLost:
            self._lost.add(index)
            return GPUStatus(index=index, lost=True)
        if index in self._lost:
            # Back on the bus: only a reset brings a card back, and a reset clears what the XID or the ECC
            # error reported.
            self._lost.discard(index)
            self._recovered.put(HealthEvent(index=index, kind="recovered", detail="back on the bus after a reset"))
        procs = {p.pid: p for p in self._processes(h)}
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
                         temperature_c=int(temp), processes=tuple(procs.values()),
                         ecc_uncorrected=self._ecc(index, h))

    def wait_events(self, timeout_s: float) -> list[HealthEvent]:
        nv = self._nv
        recovered = []
        while not self._recovered.empty():
            recovered.append(self._recovered.get())
        if recovered:
            return recovered
        if self._inv is None:
            self.inventory()
        if self._events is False or self._wait_call >= len(_WAIT_CALLS):
            time.sleep(timeout_s)
            return []
        try:
            data = self._wait(int(timeout_s * 1000))
        except nv.NVMLError_Timeout:
            return []
        except nv.NVMLError_GpuIsLost:
            return [HealthEvent(index=-1, kind="lost", detail="a GPU fell off the bus")]
        if data is None:  # this driver has no event wait at all
            return []
        index = self._index_of(data.device)
        gi = int(getattr(data, "gpuInstanceId", _NO_INSTANCE))
        instance = None if gi == _NO_INSTANCE else gi  # a MIG instance's event: that instance only
        if data.eventType & nv.nvmlEventTypeXidCriticalError:
            return [HealthEvent(index=index, kind="xid", code=int(data.eventData), gi=instance)]
        if data.eventType & nv.nvmlEventTypeDoubleBitEccError:
            return [HealthEvent(index=index, kind="ecc", code=1, detail="double-bit ECC error event")]
        return []

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutting down is best effort
            if self._events not in (None, False):
                self._nv.nvmlEventSetFree(self._events)
        with contextlib.suppress(Exception):
            self._nv.nvmlShutdown()

    # -- MIG (see mig_nvml) ---------------------------------------------------------------------------------
    def mig_cards(self) -> tuple[MigCard, ...]:
        """Every MIG-capable card: mode, profiles with their placements, and the instances that exist now."""
        return tuple(card for g in self.inventory().gpus if (card := self._mig_card(g.index)) is not None)

    def _mig_card(self, index: int) -> MigCard | None:
        """One card's MIG state (None: not MIG-capable), or MigError."""
        g = self.inventory().gpus[index]
        fam = family_of(g.name, g.memory_mib)
        try:
            return mig_nvml.read_card(self._nv, index, self._handle(index), hopper=fam.hopper if fam else None)
        except self._nv.NVMLError as e:
            raise MigError(f"card {index}: cannot read MIG state: {e}") from None

    def mig_create(self, index: int, profile_id: int, start: int) -> MigInstance:
        card = self._mig_card(index) if 0 <= index < self.inventory().count else None
        profile = card.profile(profile_id) if card else None
        if card is None or profile is None:
            raise MigError(f"card {index} has no MIG profile {profile_id}")
        return mig_nvml.create(self._nv, index, self._handle(index), profile, start)

    def mig_destroy(self, index: int, gi: int) -> bool:
        return mig_nvml.destroy(self._nv, index, self._handle(index), gi)

    def mig_set_mode(self, index: int, enabled: bool) -> str:
        return mig_nvml.set_mode(self._nv, index, self._handle(index), enabled)

    # -- discovery ------------------------------------------------------------------------------------------
    def _discover(self) -> Inventory:
        nv = self._nv
        count = self._call(nv.nvmlDeviceGetCount, "count GPUs")
        self._handles = [self._call(nv.nvmlDeviceGetHandleByIndex, f"open GPU {i}", i) for i in range(count)]
        self._handle_keys = [_handle_key(h) for h in self._handles]
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
                numa_node=self._numa(i, h, bus),
                gpm=self._gpm(h),
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
                    remote = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
                except nv.NVMLError:
                    continue  # no such link, or NVLink not supported on this card
                j = by_bus.get(_short_bus(_text(remote.busId).upper()))
                if j is not None and j != i:
                    key = (min(i, j), max(i, j))
                    pair[key] = pair.get(key, 0) + 1
                elif j is None and self._is_switch(h, link, remote):
                    to_switch[i] += 1
        # each link is seen from both ends
        out = {k: max(1, v // 2) for k, v in pair.items()}
        for a, b in itertools.combinations(range(len(self._handles)), 2):
            if to_switch[a] and to_switch[b]:
                out[(a, b)] = max(out.get((a, b), 0), min(to_switch[a], to_switch[b]))
        return out

    def _is_switch(self, handle: Any, link: int, remote_pci: Any) -> bool:
        """Is the far end of this link (not one of our GPUs) an NVSwitch? Asked directly where the driver can
        say; else an NVIDIA PCI function that is not a GPU of this node is a switch (an IBM NPU, the
        other thing NVLink reaches, is not NVIDIA's)."""
        nv = self._nv
        if not self._no_remote_type:
            try:
                return bool(nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                            == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            except (nv.NVMLError_FunctionNotFound, AttributeError):
                self._no_remote_type = True
                log.info("NVML has no nvmlDeviceGetNvLinkRemoteDeviceType (older driver): telling "
                         "NVSwitch links by the remote PCI vendor instead")
            except nv.NVMLError:
                pass  # fall through to the PCI vendor
        vendor = int(getattr(remote_pci, "pciDeviceId", 0)) & 0xFFFF
        return vendor == _NVIDIA_PCI_VENDOR

    def _numa(self, index: int, handle: Any, bus: str) -> int | None:
        """The NUMA node the card sits on, as the kubelet and NVIDIA's plugin see it: sysfs first; NVML's memory
        affinity (one node) when sysfs has no answer for this device."""
        path = self._sysfs / "bus" / "pci" / "devices" / _sysfs_bus(bus) / "numa_node"
        try:
            with path.open("rb") as f:
                text = f.read(16).decode("ascii").strip()  # a small number; never read more
        except (OSError, UnicodeDecodeError):
            text = ""
        if ascii_uint(text.removeprefix("-"), 16) is not None:
            return None if text.startswith("-") else int(text)  # -1: the kernel knows of no NUMA placement
        nv = self._nv
        try:
            mask = nv.nvmlDeviceGetMemoryAffinity(handle, _NUMA_NODE_WORDS, nv.NVML_AFFINITY_SCOPE_NODE)
        except (nv.NVMLError, AttributeError):
            log.info("GPU %d: NUMA node unknown (no %s, and NVML has no memory affinity)", index, path)
            return None
        nodes = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
        return nodes[0] if len(nodes) == 1 else None

    def _gpm(self, handle: Any) -> bool | None:
        """Does the card have GPM (per-GPU-instance SM utilisation, Hopper and later)? nvmlGpmQueryDeviceSupport;
        where the driver or binding lacks it, the architecture; None when NVML answers neither (the model name then
        decides, see devices/arch.py)."""
        nv = self._nv
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (nv.NVMLError, AttributeError):
            pass
        try:
            return gpm_by_architecture(int(nv.nvmlDeviceGetArchitecture(handle)))
        except (nv.NVMLError, AttributeError):
            return None

    # -- status helpers -------------------------------------------------------------------------------------
    def _utilization(self, handle: Any) -> int:
        """The card's utilisation; 0 where NVML has none (a MIG-enabled card: NOT_SUPPORTED, see docs/mig.md)."""
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nv.NVMLError_NotSupported:
            return 0

    def _processes(self, handle: Any) -> list[ProcessUsage]:
        """The card's compute processes, through the newest entry point this driver has."""
        nv = self._nv
        while self._process_call < len(_PROCESS_CALLS):
            name = _PROCESS_CALLS[self._process_call]
            try:
                if name.endswith("_v3") or name.endswith("_v2"):
                    raw = getattr(nv, name)(handle)
                else:
                    raw = self._processes_v1(handle)
            except (nv.NVMLError_FunctionNotFound, nv.NVMLLibraryMismatchError, AttributeError):
                self._process_call += 1
                if self._process_call < len(_PROCESS_CALLS):
                    log.info("NVML has no %s (older driver): using %s", name, _PROCESS_CALLS[self._process_call])
                else:
                    log.warning("NVML has no call listing a card's processes: per-process memory is not "
                                "reported (only SM samples)")
                continue
            except nv.NVMLError:
                return []
            return [ProcessUsage(pid=int(p.pid), used_memory_bytes=_known_bytes(p.usedGpuMemory))
                    for p in raw[:_MAX_PROCESSES]]
        return []

    def _processes_v1(self, handle: Any) -> list[Any]:
        """nvmlDeviceGetComputeRunningProcesses (v1 layout), which nvidia-ml-py no longer wraps."""
        nv = self._nv
        fn = self._c_function("nvmlDeviceGetComputeRunningProcesses")
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        if ret == nv.NVML_SUCCESS:
            return []
        if ret != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            raise nv.NVMLError(ret)
        count.value = min(count.value * 2 + 5, _MAX_PROCESSES)
        buf = (_ProcessInfoV1 * count.value)()
        ret = fn(handle, ctypes.byref(count), buf)
        if ret != nv.NVML_SUCCESS:
            raise nv.NVMLError(ret)
        return list(buf[: count.value])

    def _ecc(self, index: int, handle: Any) -> int | None:
        """Volatile uncorrected ECC errors since the last driver load; None where ECC is off or unreadable."""
        if index in self._no_ecc:
            return None
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                      nv.NVML_VOLATILE_ECC))
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound, AttributeError):
            self._no_ecc.add(index)
            log.info("GPU %d: ECC error counters not available (ECC off or not supported)", index)
        except nv.NVMLError:
            pass
        return None

    # -- events ---------------------------------------------------------------------------------------------
    def _register_events(self) -> Any:
        nv = self._nv
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("NVML event set not available (%s): XID and ECC events are not watched; ECC counters "
                        "and lost cards are still polled", e)
            return False
        for i, h in enumerate(self._handles):
            self._register_card(i, h, es)
        return es

    def _register_card(self, index: int, handle: Any, es: Any) -> None:
        """XID and double-bit ECC events, or as many of them as the card has: NVML refuses (NOT_SUPPORTED) a
        registration naming any type the card lacks, so a card with ECC off would otherwise get no XID either."""
        nv = self._nv
        xid, dbe = nv.nvmlEventTypeXidCriticalError, nv.nvmlEventTypeDoubleBitEccError
        try:
            masks = [(xid | dbe) & int(nv.nvmlDeviceGetSupportedEventTypes(handle))]
        except (nv.NVMLError, AttributeError):
            masks = [xid | dbe, xid]  # this NVML cannot say: try both, then XID alone
        for mask in masks:
            if not mask & xid:
                log.warning("GPU %d: NVML reports no XID events for this card: XID errors are not watched", index)
                return
            try:
                nv.nvmlDeviceRegisterEvents(handle, mask, es)
            except nv.NVMLError_NotSupported:
                continue
            except nv.NVMLError as e:
                log.warning("GPU %d: cannot register for XID/ECC events (%s)", index, e)
                return
            if not mask & dbe:
                log.info("GPU %d: no double-bit ECC events (ECC off or not supported): watching XID events only",
                         index)
            return
        log.warning("GPU %d: cannot register for XID events (NVML: not supported)", index)

    def _wait(self, timeout_ms: int) -> Any:
        """One event, through the newest wait call this driver has; None when it has none."""
        nv = self._nv
        while self._wait_call < len(_WAIT_CALLS):
            name = _WAIT_CALLS[self._wait_call]
            try:
                if name == "nvmlEventSetWait_v2":
                    return nv.nvmlEventSetWait_v2(self._events, timeout_ms)
                return self._wait_v1(timeout_ms)
            except (nv.NVMLError_FunctionNotFound, AttributeError):
                self._wait_call += 1
                if self._wait_call < len(_WAIT_CALLS):
                    log.info("NVML has no %s (driver older than R450): using %s", name, _WAIT_CALLS[-1])
                else:
                    log.warning("NVML has no event wait call: XID and ECC events are not watched; ECC counters "
                                "and lost cards are still polled")
        return None

    def _wait_v1(self, timeout_ms: int) -> Any:
        """nvmlEventSetWait (the pre-R450 call, which nvidia-ml-py no longer wraps): same leading fields."""
        nv = self._nv
        fn = self._c_function("nvmlEventSetWait")
        data = nv.c_nvmlEventData_t()  # larger than the v1 struct, whose fields it starts with
        ret = fn(self._events, ctypes.byref(data), ctypes.c_uint(timeout_ms))
        if ret != nv.NVML_SUCCESS:
            raise nv.NVMLError(ret)
        return data

    def _index_of(self, device: Any) -> int:
        """The card an event names: ctypes handles compare by address, not identity."""
        key = _handle_key(device)
        return self._handle_keys.index(key) if key in self._handle_keys else -1

    # -- plumbing -------------------------------------------------------------------------------------------
    def _c_function(self, name: str) -> Any:
        nv = self._nv
        lib = getattr(nv, "nvmlLib", None)
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is None:
            raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        return fn

    def _load_library(self, path: str) -> None:
        """Use this libnvidia-ml.so.1 (pynvml loads `nvmlLib` once, from the loader's path, unless it is set;
        it caches function pointers by name, which must not outlive the library they came from)."""
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise DiscoveryError(f"cannot load the NVML library {path}: {e}") from None
        setattr(self._nv, "nvmlLib", lib)  # noqa: B010 - pynvml has no setter
        cache = getattr(self._nv, "_nvmlGetFunctionPointer_cache", None)
        if isinstance(cache, dict):
            cache.clear()

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


def _handle_key(handle: Any) -> Any:
    """What identifies a device handle: the address a ctypes pointer holds (two pointer objects to one device
    are not `==`), or the handle itself for anything else."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


def _v3_struct_differs(driver: str) -> bool:
    """Drivers 535.43 to 535.86 changed the struct ..._v3 fills (adding a field) without a new version."""
    parts = driver.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return False
    return int(parts[0]) == 535 and 43 <= int(parts[1]) <= 86


def _known_bytes(value: Any) -> int:
    """A process's memory: None (nvidia-ml-py's ..._v2/_v3) or NVML_VALUE_NOT_AVAILABLE (all ones, as the
    hand-read v1 call returns it on old drivers and under some virtualisation) mean unknown, reported as 0."""
    if value is None or int(value) == _VALUE_NOT_AVAILABLE:
        return 0
    return int(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _short_bus(bus: str) -> str:
    """Bus ids come with an 8- or 4-digit domain; compare them on the last `bb:dd.f` part plus domain digits."""
    head = bus.split(":")
    if len(head) == 3:
        return f"{int(head[0], 16):04X}:{head[1]}:{head[2]}"
    return bus


def _sysfs_bus(bus: str) -> str:
    """NVML's "00000000:07:00.0" as sysfs names the device: "0000:07:00.0"."""
    return _short_bus(bus).lower()


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t: what nvmlDeviceGetComputeRunningProcesses (unversioned) fills."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
