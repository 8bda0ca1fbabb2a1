/* Memory hooks: every allocation path reserves its real size in the
 * container's shared usage before the real call (atomically across
 * processes) and gives it back if the real call fails; every free gives back
 * what its allocation reserved; unknown handles pass straight through. */
#define _GNU_SOURCE
#include <string.h>

#include "vc_hooks.h"
#include "vc_log.h"
#include "vc_pfn.h"
#include "vc_state.h"
#include "vc_table.h"

#define CALL_REAL(name, ...) (REAL(name) ? REAL(name)(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

_Atomic uint64_t vc_mem_gen;

static atomic_int slotless_reported;

/* 0 reserved; -1 refused (over the limit, or no slot for this process). */
static int reserve(int slot, uint64_t bytes)
{
    atomic_fetch_add_explicit(&vc_mem_gen, 1, memory_order_acq_rel);
    int r = vc_shm_reserve(vc.shm, slot, bytes, vc.mem_limit[slot]);
    if (r != -2)
        return r;
    /* No slot (every one was taken when CUDA started here): one may have
     * been freed since. */
    if (vc_shm_claim_if_needed(vc.shm, vc.host_pid) == 0) {
        vc_shm_set_nvml(vc.shm, vc.nvml_mask);
        r = vc_shm_reserve(vc.shm, slot, bytes, vc.mem_limit[slot]);
        if (r != -2)
            return r;
    }
    if (atomic_exchange(&slotless_reported, 1) == 0)
        VC_ERROR("this container already has %d live processes using CUDA, the most its shared state can account "
                 "for, so this process gets no device memory: its allocations return CUDA_ERROR_OUT_OF_MEMORY "
                 "until one of them ends",
                 VC_MAX_SLOTS);
    return -1;
}

static void unreserve(int slot, uint64_t bytes)
{
    vc_shm_unreserve(vc.shm, slot, bytes);
    atomic_fetch_add_explicit(&vc_mem_gen, 1, memory_order_acq_rel);
}

/* Slot to count an allocation on the current context's device, or -1 to
 * pass the call through uncounted (no context, no cap, or not ready). */
static int counted_slot(int *rc)
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
    if (s < 0 || vc.mem_limit[s] == VC_NO_CAP)
        return -1;
    return s;
}

static int slot_or_pass(int *rc)
{
    int e = vc_enter();
    *rc = CUDA_SUCCESS;
    if (e >= 0) {
        *rc = e;
        return -2;
    }
    return e == VC_PASS ? -1 : 0;
}

/* ---- bytes of CUDA arrays ---- */

/* Bytes per texel (or per 4x4 block when *block is set); 0 if unknown. */
static uint64_t format_bytes(int fmt, unsigned ch, int *block)
{
    *block = 0;
    switch (fmt) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return ch;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2ull * ch;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4ull * ch;
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
        return 1;
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
        return 2;
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
        return 4;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
        return 8;
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
        *block = 1;
        return 8;
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB:
        *block = 1;
        return 16;
    default:
        return 0;
    }
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    if (a && b > UINT64_MAX / a)
        return UINT64_MAX;
    return a * b;
}

/* Bytes of an array (all mipmap levels), counting elements as bytes, never bits. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch, unsigned flags, unsigned levels)
{
    if (flags & (CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_SPARSE))
        return 0; /* backed later by cuMemCreate memory, which is counted there */
    int block;
    uint64_t tb = format_bytes(fmt, ch ? ch : 1, &block);
    if (fmt == CU_AD_FORMAT_NV12) {
        /* 8-bit 4:2:0: a full-size luma plane and a half-size chroma plane. */
        uint64_t px = mul_sat(mul_sat(w, h ? h : 1), d ? d : 1);
        return mul_sat(px, 3) / 2;
    }
    if (tb == 0) {
        tb = 16; /* a format this shim does not know: count the widest texel */
        VC_DEBUG("array format 0x%x unknown; counted as 16 bytes per element", fmt);
    }
    uint64_t total = 0;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t lw = (w >> l) ? (w >> l) : 1;
        uint64_t lh = h ? ((h >> l) ? (h >> l) : 1) : 1;
        uint64_t ld = d ? ((flags & CUDA_ARRAY3D_LAYERED) ? d : ((d >> l) ? (d >> l) : 1)) : 1;
        uint64_t b = block ? mul_sat(mul_sat((lw + 3) / 4, (lh + 3) / 4), mul_sat(ld, tb))
                           : mul_sat(mul_sat(lw, lh), mul_sat(ld, tb));
        total = total + b < total ? UINT64_MAX : total + b;
    }
    return total;
}

/* ---- linear allocations ---- */

/* Check-and-reserve against the limit, call the driver, roll back if it fails, and remember the handle so that
   its free gives the bytes back. `key_expr` is read after the call (the handle the driver wrote). */
#define RESERVE_BODY(kind, call, key_expr, bytes_expr)                                                 \
    int rc;                                                                                            \
    int s = counted_slot(&rc);                                                                         \
    if (s == -2)                                                                                       \
        return rc;                                                                                     \
    if (s < 0)                                                                                         \
        return call;                                                                                   \
    uint64_t bytes = (bytes_expr);                                                                     \
    if (reserve(s, bytes) != 0)                                                                        \
        return CUDA_ERROR_OUT_OF_MEMORY;                                                               \
    CUresult r = call;                                                                                 \
    if (r != CUDA_SUCCESS) {                                                                           \
        unreserve(s, bytes);                                                                           \
        return r;                                                                                      \
    }                                                                                                  \
    if (vc_table_add((kind), (key_expr), s, bytes) != 0)                                               \
        VC_WARN("allocation table full; %llu bytes will not be given back on free",                    \
                (unsigned long long)bytes);                                                            \
    return r;

#define ALLOC_BODY(call, ptr_expr, bytes_expr) RESERVE_BODY(VC_KIND_DPTR, call, (uint64_t)(ptr_expr), bytes_expr)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    ALLOC_BODY(CALL_REAL(cuMemAlloc_v2, dptr, size), *dptr, size)
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    ALLOC_BODY(CALL_REAL(cuMemAlloc, dptr, size), *dptr, size)
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    ALLOC_BODY(CALL_REAL(cuMemAllocManaged, dptr, size, flags), *dptr, size)
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream st)
{
    ALLOC_BODY(CALL_REAL(cuMemAllocAsync, dptr, size, st), *dptr, size)
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream st)
{
    ALLOC_BODY(CALL_REAL(cuMemAllocAsync_ptsz, dptr, size, st), *dptr, size)
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream st)
{
    ALLOC_BODY(CALL_REAL(cuMemAllocFromPoolAsync, dptr, size, pool, st), *dptr, size)
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream st)
{
    ALLOC_BODY(CALL_REAL(cuMemAllocFromPoolAsync_ptsz, dptr, size, pool, st), *dptr, size)
}

/* Pitched allocations: the driver chooses the pitch, so reserve an estimate
 * first and settle on pitch x height once the real pitch is known. */
static CUresult settle_pitch(int s, uint64_t estimate, uint64_t real_bytes)
{
    if (real_bytes > estimate) {
        if (reserve(s, real_bytes - estimate) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
    } else if (real_bytes < estimate) {
        unreserve(s, estimate - real_bytes);
    }
    return CUDA_SUCCESS;
}

static uint64_t pitch_estimate(uint64_t width, uint64_t height)
{
    CUdevice d = 0;
    uint64_t a = 0;
    if (vc.single_slot >= 0)
        a = vc.pitch_align[0];
    else if (REAL_I(cuCtxGetDevice) && REAL_I(cuCtxGetDevice)(&d) == CUDA_SUCCESS && d >= 0 && d < vc.ndev)
        a = vc.pitch_align[d];
    uint64_t row = a ? (width + a - 1) / a * a : width;
    return mul_sat(row, height);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    int rc;
    int s = counted_slot(&rc);
    if (s == -2)
        return rc;
    if (s < 0)
        return CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, w, h, elem);
    uint64_t est = pitch_estimate(w, h);
    if (reserve(s, est) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, w, h, elem);
    if (r != CUDA_SUCCESS) {
        unreserve(s, est);
        return r;
    }
    uint64_t bytes = mul_sat(*pitch, h);
    if (settle_pitch(s, est, bytes) != CUDA_SUCCESS) {
        unreserve(s, est);
        CALL_REAL(cuMemFree_v2, *dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vc_table_add(VC_KIND_DPTR, *dptr, s, bytes);
    return r;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int elem)
{
    int rc;
    int s = counted_slot(&rc);
    if (s == -2)
        return rc;
    if (s < 0)
        return CALL_REAL(cuMemAllocPitch, dptr, pitch, w, h, elem);
    uint64_t est = pitch_estimate(w, h);
    if (reserve(s, est) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CALL_REAL(cuMemAllocPitch, dptr, pitch, w, h, elem);
    if (r != CUDA_SUCCESS) {
        unreserve(s, est);
        return r;
    }
    uint64_t bytes = (uint64_t)*pitch * h;
    if (settle_pitch(s, est, bytes) != CUDA_SUCCESS) {
        unreserve(s, est);
        CALL_REAL(cuMemFree, *dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vc_table_add(VC_KIND_DPTR, *dptr, s, bytes);
    return r;
}

/* ---- frees ---- */

#define FREE_BODY(KIND, KEY, CALL)                                                                     \
    int rc_;                                                                                           \
    if (slot_or_pass(&rc_) == -2)                                                                      \
        return rc_;                                                                                    \
    struct vc_alloc ent_;                                                                              \
    if (!vc_table_take(KIND, (uint64_t)(KEY), &ent_))                                                  \
        return CALL; /* not ours: the driver decides */                                                \
    CUresult r_ = CALL;                                                                                \
    if (r_ == CUDA_SUCCESS)                                                                            \
        unreserve(ent_.dev, ent_.bytes);                                                               \
    else                                                                                               \
        vc_table_add(KIND, ent_.key, ent_.dev, ent_.bytes);                                            \
    return r_;

CUresult cuMemFree_v2(CUdeviceptr p)
{
    FREE_BODY(VC_KIND_DPTR, p, CALL_REAL(cuMemFree_v2, p))
}

CUresult cuMemFree(CUdeviceptr_v1 p)
{
    FREE_BODY(VC_KIND_DPTR, p, CALL_REAL(cuMemFree, p))
}

CUresult cuMemFreeAsync(CUdeviceptr p, CUstream st)
{
    FREE_BODY(VC_KIND_DPTR, p, CALL_REAL(cuMemFreeAsync, p, st))
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream st)
{
    FREE_BODY(VC_KIND_DPTR, p, CALL_REAL(cuMemFreeAsync_ptsz, p, st))
}

/* ---- arrays ---- */

#define ARRAY_BODY(kind, out, call, bytes_expr) \
    RESERVE_BODY(kind, call, (uint64_t)(uintptr_t)(*(out)), bytes_expr)

CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    ARRAY_BODY(VC_KIND_ARRAY, a, CALL_REAL(cuArrayCreate_v2, a, d),
               d ? array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 0, 1) : 0)
}

CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    ARRAY_BODY(VC_KIND_ARRAY, a, CALL_REAL(cuArrayCreate, a, d),
               d ? array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 0, 1) : 0)
}

CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    ARRAY_BODY(VC_KIND_ARRAY, a, CALL_REAL(cuArray3DCreate_v2, a, d),
               d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, 1) : 0)
}

CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    ARRAY_BODY(VC_KIND_ARRAY, a, CALL_REAL(cuArray3DCreate, a, d),
               d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, 1) : 0)
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    ARRAY_BODY(VC_KIND_MIPMAP, m, CALL_REAL(cuMipmappedArrayCreate, m, d, levels),
               d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, levels) : 0)
}

CUresult cuArrayDestroy(CUarray a)
{
    FREE_BODY(VC_KIND_ARRAY, (uintptr_t)a, CALL_REAL(cuArrayDestroy, a))
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    FREE_BODY(VC_KIND_MIPMAP, (uintptr_t)m, CALL_REAL(cuMipmappedArrayDestroy, m))
}

/* ---- virtual memory management (as NCCL and PyTorch's expandable segments use) ---- */

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    int rc;
    int go = slot_or_pass(&rc);
    if (go == -2)
        return rc;
    if (go < 0 || !prop || !h || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CALL_REAL(cuMemCreate, h, size, prop, flags); /* host memory is not device memory */
    int s = vc_slot_of(prop->location.id);
    if (vc.mem_limit[s] == VC_NO_CAP)
        return CALL_REAL(cuMemCreate, h, size, prop, flags);
    if (reserve(s, size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CALL_REAL(cuMemCreate, h, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        unreserve(s, size);
        return r;
    }
    vc_table_add(VC_KIND_VMM, *h, s, size);
    return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    FREE_BODY(VC_KIND_VMM, h, CALL_REAL(cuMemRelease, h))
}
