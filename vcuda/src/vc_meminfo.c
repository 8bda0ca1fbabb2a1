/* What the container is told about memory, the same everywhere:
 * total = min(limit, physical), used = what the container holds,
 * free = total - used, never negative and never more than is physically free. */
#define _GNU_SOURCE
#include <string.h>

#include "vc_hooks.h"
#include "vc_loader.h"
#include "vc_pfn.h"
#include "vc_state.h"

struct view {
    uint64_t total, free, used;
};

static struct view view_with(int s, uint64_t limit, uint64_t phys_total, uint64_t phys_free)
{
    struct view v;
    v.total = limit < phys_total ? limit : phys_total;
    uint64_t in_use = vc_shm_in_use(vc.shm, s);
    v.free = in_use < v.total ? v.total - in_use : 0;
    if (v.free > phys_free)
        v.free = phys_free;
    v.used = v.total - v.free;
    return v;
}

static struct view view_of(int s, uint64_t phys_total, uint64_t phys_free)
{
    return view_with(s, vc.mem_limit[s], phys_total, phys_free);
}

/* Slot whose view applies, or -1 to report the real figures. */
static int info_slot(int *rc)
{
    int e = vc_enter();
    *rc = CUDA_SUCCESS;
    if (e >= 0) {
        *rc = e;
        return -2;
    }
    if (e == VC_PASS)
        return -1;
    int s = vc_current_slot();
    return (s >= 0 && vc.mem_limit[s] != VC_NO_CAP) ? s : -1;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    int rc;
    int s = info_slot(&rc);
    if (s == -2)
        return rc;
    if (!REAL(cuMemGetInfo_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemGetInfo_v2)(free_b, total);
    if (r != CUDA_SUCCESS || s < 0)
        return r;
    struct view v = view_of(s, *total, *free_b);
    *total = v.total;
    *free_b = v.free;
    return r;
}

CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    int rc;
    int s = info_slot(&rc);
    if (s == -2)
        return rc;
    if (!REAL(cuMemGetInfo))
        return CUDA_ERROR_NOT_FOUND;
    if (s < 0)
        return REAL(cuMemGetInfo)(free_b, total);
    size_t f64 = 0, t64 = 0;
    CUresult r = REAL(cuMemGetInfo_v2) ? REAL(cuMemGetInfo_v2)(&f64, &t64) : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS)
        return REAL(cuMemGetInfo)(free_b, total);
    struct view v = view_of(s, t64, f64);
    *total = v.total > 0xffffffffull ? 0xffffffffu : (unsigned int)v.total;
    *free_b = v.free > 0xffffffffull ? 0xffffffffu : (unsigned int)v.free;
    return r;
}

static int device_slot(CUdevice dev, int *rc)
{
    int e = vc_enter();
    *rc = CUDA_SUCCESS;
    if (e >= 0) {
        *rc = e;
        return -2;
    }
    if (e == VC_PASS)
        return -1;
    int s = vc_slot_of(dev);
    return vc.mem_limit[s] != VC_NO_CAP ? s : -1;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    int rc;
    int s = device_slot(dev, &rc);
    if (s == -2)
        return rc;
    if (!REAL(cuDeviceTotalMem_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r == CUDA_SUCCESS && s >= 0 && vc.mem_limit[s] < *bytes)
        *bytes = vc.mem_limit[s];
    return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    int rc;
    int s = device_slot(dev, &rc);
    if (s == -2)
        return rc;
    if (!REAL(cuDeviceTotalMem))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceTotalMem)(bytes, dev);
    if (r == CUDA_SUCCESS && s >= 0 && vc.mem_limit[s] < *bytes)
        *bytes = (unsigned int)vc.mem_limit[s];
    return r;
}

/* ---- NVML ---- */

/* Slot of an NVML device, matched by UUID exactly as CUDA's devices are
 * (vc_slot_for_uuid), so both report the same limit; -1 for devices without
 * a cap. A device the limits do not name has a cap of 0, here as in CUDA. */
static int nvml_slot(nvmlDevice_t d)
{
    int p = vc_process_init();
    if (p != VC_PHASE_LIMITS && p != VC_PHASE_READY)
        return -1; /* no limits here: NVML reports the card as it is */
    if (vc_loader_nvml() != 0 || !REAL_I(nvmlDeviceGetUUID))
        return -1;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (REAL_I(nvmlDeviceGetUUID)(d, uuid, sizeof(uuid)) != NVML_SUCCESS)
        return -1;
    int s = vc_slot_for_uuid(uuid);
    return vc_cap_of_slot(s) != VC_NO_CAP ? s : -1;
}

static struct view nvml_view(int s, uint64_t total, uint64_t free_b)
{
    /* NVML may be used before CUDA: the same caps, the same shared usage. */
    return view_with(s, vc_cap_of_slot(s), total, free_b);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    if (vc_loader_nvml() != 0 || !REAL(nvmlDeviceGetMemoryInfo))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo)(d, m);
    if (r != NVML_SUCCESS)
        return r;
    int s = nvml_slot(d);
    if (s >= 0) {
        struct view v = nvml_view(s, m->total, m->free);
        m->total = v.total;
        m->free = v.free;
        m->used = v.used;
    }
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    if (vc_loader_nvml() != 0 || !REAL(nvmlDeviceGetMemoryInfo_v2))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(d, m);
    if (r != NVML_SUCCESS)
        return r;
    int s = nvml_slot(d);
    if (s >= 0) {
        struct view v = nvml_view(s, m->total, m->free);
        m->total = v.total;
        m->reserved = 0;
        m->free = v.free;
        m->used = v.used;
    }
    return r;
}
