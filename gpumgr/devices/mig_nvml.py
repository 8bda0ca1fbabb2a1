"""MIG through nvidia-ml-py: read a card's mode, profiles, placements and instances; create an instance at a
placement (a GPU instance and its one full-size compute instance); destroy one; switch the mode.

The caller passes the `pynvml` module and the parent's handle (only gpumgr/devices imports pynvml). NVML errors
become `MigError` messages that name the card, the profile, the placement and what to do.
Notes: the profile enum goes into GetGpuInstanceProfileInfo, the profile *id* it returns into everything else;
CreateGpuInstanceWithPlacement takes a pointer to the placement (ctypes.byref); a GPU instance split into
several compute instances is not a shape gpumgr makes, and is reported as `foreign`.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from gpumgr.mig.types import MigCard, MigError, MigInstance, MigProfile

_CI_SLICES = (1, 2, 3, 4, 7, 8, 6)  # NVML_COMPUTE_INSTANCE_PROFILE_* -> compute slices
_MAX_PROFILE_ENUM = 0x20  # bound on the enum loop (NVML stops with INVALID_ARGUMENT before it)
_MAX_INSTANCES = 16


def read_card(nv: Any, index: int, handle: Any, hopper: bool | None = None) -> MigCard | None:
    """The card's MIG state, or None when it is not MIG-capable (NOT_SUPPORTED)."""
    try:
        current, pending = nv.nvmlDeviceGetMigMode(handle)
    except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound, AttributeError):
        return None
    profiles = _profiles(nv, handle)
    if not profiles:
        return None
    compute = max(p.slices for p in profiles)
    memory = max(p.memory_slices for p in profiles)
    instances = _instances(nv, index, handle, profiles) if current else ()
    return MigCard(index=index, enabled=bool(current), pending=bool(pending), memory_slices=memory,
                   compute_slices=compute, profiles=profiles, instances=instances,
                   needs_reset=not hopper if hopper is not None else True)


def create(nv: Any, index: int, handle: Any, profile: MigProfile, start: int) -> MigInstance:
    where = f"card {index}: {profile.name} at memory slice {start}"
    placement = nv.c_nvmlGpuInstancePlacement_t(start, profile.memory_slices)
    try:
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.id, ctypes.byref(placement))
    except nv.NVMLError as e:
        raise MigError(f"{where}: {_why(nv, e)}") from None
    try:
        ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, _CI_SLICES.index(profile.slices))
        info = nv.nvmlComputeInstanceGetInfo(ci)
        uuid = _text(nv.nvmlDeviceGetUUID(info.device))
        gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
        memory = int(nv.nvmlDeviceGetMemoryInfo(info.device).total) >> 20
    except (nv.NVMLError, ValueError) as e:
        with contextlib.suppress(nv.NVMLError):  # leave nothing half made
            nv.nvmlGpuInstanceDestroy(gi)
        raise MigError(f"{where}: compute instance not created: {_why(nv, e)}") from None
    return MigInstance(card=index, gi=gi_id, ci=int(info.id), profile_id=profile.id, profile=profile.name,
                       start=start, size=profile.memory_slices, memory_mib=memory, uuid=uuid)


def destroy(nv: Any, index: int, handle: Any, gi_id: int) -> bool:
    """Destroy GPU instance `gi_id` and its compute instances; False when it did not exist."""
    where = f"card {index}: MIG instance {gi_id}"
    try:
        gi = nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    except nv.NVMLError_NotFound:
        return False
    except nv.NVMLError as e:
        raise MigError(f"{where}: {_why(nv, e)}") from None
    try:
        for ci in _compute_instances(nv, gi):
            nv.nvmlComputeInstanceDestroy(ci)
        nv.nvmlGpuInstanceDestroy(gi)
    except nv.NVMLError as e:
        raise MigError(f"{where} not destroyed: {_why(nv, e)}") from None
    return True


def set_mode(nv: Any, index: int, handle: Any, enabled: bool) -> str:
    """Ask for MIG on or off: "done", or "reset required" (Ampere: takes effect at the next GPU reset)."""
    try:
        status = nv.nvmlDeviceSetMigMode(handle, nv.NVML_DEVICE_MIG_ENABLE if enabled else nv.NVML_DEVICE_MIG_DISABLE)
    except nv.NVMLError as e:
        raise MigError(f"card {index}: MIG mode not changed: {_why(nv, e)}") from None
    if status == nv.NVML_SUCCESS:
        return "done"
    if status == nv.NVML_ERROR_RESET_REQUIRED:
        return "reset required"
    raise MigError(f"card {index}: MIG mode pending, not active: {_why(nv, nv.NVMLError(status))}")


# -- reading ------------------------------------------------------------------------------------------------------
def _profiles(nv: Any, handle: Any) -> tuple[MigProfile, ...]:
    out = []
    for en in range(min(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 18)), _MAX_PROFILE_ENUM)):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, en)
        except nv.NVMLError_InvalidArgument:
            break
        except nv.NVMLError:
            continue  # NOT_SUPPORTED: this card has no such profile
        starts = _placements(nv, handle, int(info.id))
        out.append(MigProfile(id=int(info.id), name=_text(info.name).removeprefix("MIG "),
                              slices=int(info.sliceCount), memory_slices=starts[0][1] if starts else 0,
                              memory_mib=int(info.memorySizeMB), max_count=int(info.instanceCount),
                              multiprocessors=int(info.multiprocessorCount), starts=tuple(s for s, _ in starts)))
    return tuple(out)


def _placements(nv: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    try:
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
        n = min(count.value, _MAX_INSTANCES)
        arr = (nv.c_nvmlGpuInstancePlacement_t * max(n, 1))()
        count.value = n
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, arr, ctypes.byref(count))
    except nv.NVMLError:
        return []
    return [(int(p.start), int(p.size)) for p in arr[: count.value]]


def _instances(nv: Any, index: int, handle: Any, profiles: tuple[MigProfile, ...]) -> tuple[MigInstance, ...]:
    out = []
    for p in profiles:
        arr = (nv.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        try:
            nv.nvmlDeviceGetGpuInstances(handle, p.id, arr, ctypes.byref(count))
        except nv.NVMLError:
            continue
        for gi in arr[: count.value]:
            info = nv.nvmlGpuInstanceGetInfo(gi)
            cis = _compute_instances(nv, gi)
            # no CI: a creation cut short (ours, to finish or undo); several: a layout gpumgr does not make
            uuid, ci_id, memory, foreign = "", 0, p.memory_mib, len(cis) > 1
            if len(cis) == 1:
                ci_info = nv.nvmlComputeInstanceGetInfo(cis[0])
                ci_id = int(ci_info.id)
                foreign = int(ci_info.placement.size) != p.slices
                uuid = _text(nv.nvmlDeviceGetUUID(ci_info.device))
                memory = int(nv.nvmlDeviceGetMemoryInfo(ci_info.device).total) >> 20
            out.append(MigInstance(card=index, gi=int(info.id), ci=ci_id, profile_id=p.id, profile=p.name,
                                   start=int(info.placement.start), size=int(info.placement.size),
                                   memory_mib=memory, uuid=uuid, foreign=foreign))
    return tuple(sorted(out, key=lambda i: i.gi))


def _compute_instances(nv: Any, gi: Any) -> list[Any]:
    found = []
    for en in range(len(_CI_SLICES)):
        arr = (nv.c_nvmlComputeInstance_t * 8)()
        count = ctypes.c_uint(8)
        try:
            nv.nvmlGpuInstanceGetComputeInstances(gi, en, arr, ctypes.byref(count))
        except nv.NVMLError:
            continue
        found += arr[: count.value]
    return found


def _why(nv: Any, e: Exception) -> str:
    if isinstance(e, nv.NVMLError_InsufficientResources):
        return "the placement is occupied (another instance overlaps it) or the card's slices are used up"
    if isinstance(e, nv.NVMLError_InUse):
        return "in use (a process runs on it, or instances exist): stop it first"
    if isinstance(e, nv.NVMLError_NoPermission):
        return "not permitted: creating and destroying MIG instances needs CAP_SYS_ADMIN or the mig-config " \
               "capability (run the agent privileged)"
    if isinstance(e, nv.NVMLError_NotSupported):
        return "MIG mode is off on this card (or MIG not supported)"
    if isinstance(e, nv.NVMLError_InvalidArgument):
        return "no such profile or placement on this card"
    return f"NVML error: {e}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
