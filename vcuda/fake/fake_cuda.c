/* Fake libcuda.so.1: enough of the CUDA driver API to run the shim's tests,
 * backed by the simulated card in fake_state.c. Test-only settings:
 *   FAKEGPU_STATE      state file made by `fakegpu init` (required)
 *   FAKEGPU_BLOCK_NS   simulated time per thread block of a kernel (default 1000)
 *   FAKEGPU_QUEUE      launches a process may have pending before a launch blocks (default 1024)
 *   FAKEGPU_JITTER     percent by which each kernel's duration varies at random (default 0)
 * It honours CUDA_VISIBLE_DEVICES (indices or UUIDs) like the real driver. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_state.h"
#include "vc_cuda.h"

#define API __attribute__((visibility("default")))

struct fake_ctx {
    int ordinal;
    int primary;
    int alive;
};

struct alloc {
    unsigned long long key;
    uint64_t size;
    int hostdev;
    int used;
};

struct fake_pool {
    int ordinal;
};

struct fake_graph {
    uint64_t blocks;
    int nodes;
};

struct fake {
    pthread_mutex_t mu;
    struct fg_shared *s;
    int slot;
    int inited;
    int vis[FG_MAX_DEV];
    int nvis;
    uint64_t block_ns;
    unsigned jitter;
    uint64_t rng;
    struct fake_ctx prim[FG_MAX_DEV];
    int prim_refs[FG_MAX_DEV];
    struct alloc *allocs;
    size_t nallocs, cap;
    uint64_t *ring;
    size_t qlen, qhead;
    pthread_mutex_t qmu;
    unsigned long long n_legacy, n_ptsz, n_graph, n_coop, n_ex;
    unsigned int next_legacy_ptr;
    struct fake_pool default_pool[FG_MAX_DEV];
};

static struct fake F = {.mu = PTHREAD_MUTEX_INITIALIZER, .qmu = PTHREAD_MUTEX_INITIALIZER, .slot = -1};

/* Like the real driver: CUDA does not carry over into a child forked after
 * cuInit. Every call there (cuInit included) answers CUDA_ERROR_NOT_INITIALIZED,
 * the "initialization error" such workers see. A child forked before cuInit
 * initialises CUDA as a new process. */
static int forked_after_init;

static void fake_after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&F.mu, &fresh, sizeof(fresh));
    memcpy(&F.qmu, &fresh, sizeof(fresh));
    if (F.inited)
        forked_after_init = 1;
}
static __thread struct fake_ctx *cur_ctx;

static int parse_visible(void)
{
    struct fg_shared *s = F.s;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    F.nvis = 0;
    if (!cvd) {
        for (int i = 0; i < s->ndev; i++)
            F.vis[F.nvis++] = i;
        return 0;
    }
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", cvd);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        int found = -1;
        if (strncmp(tok, "GPU-", 4) == 0 || strncmp(tok, "MIG-", 4) == 0) {
            for (int i = 0; i < s->ndev; i++)
                if (strncmp(s->dev[i].uuid, tok, strlen(tok)) == 0)
                    found = i;
        } else {
            char *end = NULL;
            long v = strtol(tok, &end, 10);
            if (end != tok && *end == 0 && v >= 0 && v < s->ndev)
                found = (int)v;
        }
        if (found < 0)
            break; /* like the real driver: an invalid entry hides it and everything after it */
        F.vis[F.nvis++] = found;
        if (F.nvis == FG_MAX_DEV)
            break;
    }
    return 0;
}

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, fake_after_fork_child);
}

API CUresult cuInit(unsigned int flags)
{
    (void)flags;
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&F.mu);
    if (forked_after_init) {
        pthread_mutex_unlock(&F.mu);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (F.inited) {
        pthread_mutex_unlock(&F.mu);
        return CUDA_SUCCESS;
    }
    F.s = fg_attach(NULL);
    if (!F.s) {
        pthread_mutex_unlock(&F.mu);
        return CUDA_ERROR_NO_DEVICE;
    }
    const char *b = getenv("FAKEGPU_BLOCK_NS");
    F.block_ns = b ? strtoull(b, NULL, 10) : 1000;
    const char *j = getenv("FAKEGPU_JITTER");
    F.jitter = j ? (unsigned)atoi(j) : 0;
    if (F.jitter > 90)
        F.jitter = 90;
    F.rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    const char *q = getenv("FAKEGPU_QUEUE");
    F.qlen = q ? strtoull(q, NULL, 10) : 1024;
    if (F.qlen < 1 || F.qlen > 65536)
        F.qlen = 1024;
    F.ring = calloc(F.qlen, sizeof(uint64_t));
    parse_visible();
    fg_lock(F.s);
    F.slot = fg_proc_slot(F.s, getpid());
    if (F.slot >= 0)
        F.s->proc[F.slot].nvml_pid = fg_host_pid();
    fg_unlock(F.s);
    if (F.slot < 0 || !F.ring) {
        pthread_mutex_unlock(&F.mu);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    for (int i = 0; i < FG_MAX_DEV; i++) {
        F.prim[i].ordinal = i;
        F.prim[i].primary = 1;
        F.default_pool[i].ordinal = i;
    }
    F.inited = 1;
    pthread_mutex_unlock(&F.mu);
    return CUDA_SUCCESS;
}

#define NEED_INIT()                                                                                    \
    do {                                                                                               \
        if (!F.inited || forked_after_init)                                                            \
            return CUDA_ERROR_NOT_INITIALIZED;                                                         \
    } while (0)

static int host_dev(int ordinal)
{
    if (ordinal < 0 || ordinal >= F.nvis)
        return -1;
    return F.vis[ordinal];
}

static int cur_host_dev(void)
{
    if (!cur_ctx || !cur_ctx->alive)
        return -1;
    return host_dev(cur_ctx->ordinal);
}

API CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_shared *s = F.s ? F.s : fg_attach(NULL);
    *v = s ? s->driver_version : 13000;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = F.nvis;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (!d || host_dev(ordinal) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    NEED_INIT();
    int h = host_dev(d);
    if (h < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", F.s->dev[h].name);
    return CUDA_SUCCESS;
}

static CUresult get_uuid(CUuuid *u, CUdevice d)
{
    NEED_INIT();
    int h = host_dev(d);
    if (h < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!u)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char b[16];
    if (fg_parse_uuid(F.s->dev[h].uuid, b) != 0)
        memset(b, 0, sizeof(b));
    memcpy(u->bytes, b, 16);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return get_uuid(u, d); }
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return get_uuid(u, d); }

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    NEED_INIT();
    int h = host_dev(d);
    if (h < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = F.s->dev[h].total;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d)
{
    size_t b = 0;
    CUresult r = cuDeviceTotalMem_v2(&b, d);
    if (r == CUDA_SUCCESS)
        *bytes = b > 0xffffffffull ? 0xffffffffu : (unsigned int)b;
    return r;
}

API CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
    NEED_INIT();
    int h = host_dev(d);
    if (h < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = F.s->dev[h].sms;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
        *v = (int)F.s->pitch_align;
        return CUDA_SUCCESS;
    default:
        *v = 0;
        return CUDA_SUCCESS;
    }
}

/* ---- memory pool ---- */

static CUresult pool_take(int h, uint64_t size)
{
    struct fg_shared *s = F.s;
    fg_lock(s);
    struct fg_dev *d = &s->dev[h];
    if (size > d->total || d->used > d->total - size) {
        fg_unlock(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    d->used += size;
    s->proc[F.slot].mem[h] += size;
    fg_unlock(s);
    return CUDA_SUCCESS;
}

static void pool_give(int h, uint64_t size)
{
    struct fg_shared *s = F.s;
    fg_lock(s);
    s->dev[h].used -= size <= s->dev[h].used ? size : s->dev[h].used;
    uint64_t *m = &s->proc[F.slot].mem[h];
    *m -= size <= *m ? size : *m;
    fg_unlock(s);
}

static unsigned long long new_ptr(uint64_t size)
{
    return __atomic_fetch_add(&F.s->next_ptr, (size + 0xfffull) & ~0xfffull, __ATOMIC_RELAXED);
}

static void table_add(unsigned long long key, uint64_t size, int h)
{
    pthread_mutex_lock(&F.mu);
    if (F.nallocs == F.cap) {
        size_t nc = F.cap ? F.cap * 2 : 256;
        struct alloc *n = realloc(F.allocs, nc * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&F.mu);
            return;
        }
        F.allocs = n;
        F.cap = nc;
    }
    F.allocs[F.nallocs++] = (struct alloc){.key = key, .size = size, .hostdev = h, .used = 1};
    pthread_mutex_unlock(&F.mu);
}

static int table_take(unsigned long long key, struct alloc *out)
{
    pthread_mutex_lock(&F.mu);
    for (size_t i = 0; i < F.nallocs; i++) {
        if (F.allocs[i].key == key) {
            *out = F.allocs[i];
            F.allocs[i] = F.allocs[--F.nallocs];
            pthread_mutex_unlock(&F.mu);
            return 1;
        }
    }
    pthread_mutex_unlock(&F.mu);
    return 0;
}

static CUresult alloc_on(int h, uint64_t size, unsigned long long *out)
{
    if (h < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = pool_take(h, size);
    if (r != CUDA_SUCCESS)
        return r;
    *out = new_ptr(size);
    table_add(*out, size, h);
    return CUDA_SUCCESS;
}

static CUresult free_key(unsigned long long key)
{
    struct alloc a;
    if (!table_take(key, &a))
        return CUDA_ERROR_INVALID_VALUE;
    pool_give(a.hostdev, a.size);
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    NEED_INIT();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on(cur_host_dev(), size, p);
}

API CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int size)
{
    NEED_INIT();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long big;
    CUresult r = alloc_on(cur_host_dev(), size, &big);
    if (r != CUDA_SUCCESS)
        return r;
    /* Re-key the allocation under a 32-bit handle. */
    struct alloc a;
    table_take(big, &a);
    unsigned int small = 0x100000u + __atomic_fetch_add(&F.next_legacy_ptr, 0x1000u, __ATOMIC_RELAXED);
    table_add(small, a.size, a.hostdev);
    *p = small;
    return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
    NEED_INIT();
    return free_key(p);
}

API CUresult cuMemFree(CUdeviceptr_v1 p)
{
    NEED_INIT();
    return free_key(p);
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    NEED_INIT();
    if (!p || !pitch || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t a = F.s->pitch_align;
    size_t pt = (w + a - 1) / a * a;
    CUresult r = alloc_on(cur_host_dev(), (uint64_t)pt * h, p);
    if (r == CUDA_SUCCESS)
        *pitch = pt;
    return r;
}

API CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h,
                             unsigned int elem)
{
    NEED_INIT();
    if (!p || !pitch || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned int a = (unsigned int)F.s->pitch_align;
    unsigned int pt = (w + a - 1) / a * a;
    CUresult r = cuMemAlloc(p, pt * h);
    if (r == CUDA_SUCCESS)
        *pitch = pt;
    return r;
}

API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    NEED_INIT();
    (void)flags;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on(cur_host_dev(), size, p);
}

API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    NEED_INIT();
    int h = cur_host_dev();
    if (h < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    fg_lock(F.s);
    *total = F.s->dev[h].total;
    *free_b = F.s->dev[h].total - F.s->dev[h].used;
    fg_unlock(F.s);
    return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffull ? 0xffffffffu : (unsigned int)f;
        *total = t > 0xffffffffull ? 0xffffffffu : (unsigned int)t;
    }
    return r;
}

/* Arrays: the fake charges exact texel bytes. */
static uint64_t texel_bytes(int fmt, unsigned int ch, int *block)
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
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC4_UNORM:
        *block = 1;
        return 8;
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC7_UNORM:
        *block = 1;
        return 16;
    default:
        return 0;
    }
}

static CUresult array_alloc(size_t w, size_t h, size_t d, int fmt, unsigned int ch, unsigned int flags,
                            unsigned int levels, unsigned long long *out)
{
    int blk;
    uint64_t tb = texel_bytes(fmt, ch, &blk);
    if (w == 0 || tb == 0 || (ch != 1 && ch != 2 && ch != 4))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned int l = 0; l < (levels ? levels : 1); l++) {
        uint64_t lw = w >> l ? w >> l : 1;
        uint64_t lh = h ? (h >> l ? h >> l : 1) : 1;
        uint64_t ld = d ? ((flags & CUDA_ARRAY3D_LAYERED) ? d : (d >> l ? d >> l : 1)) : 1;
        if (blk)
            total += ((lw + 3) / 4) * ((lh + 3) / 4) * ld * tb;
        else
            total += lw * lh * ld * tb;
    }
    if (flags & (CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_SPARSE)) {
        *out = new_ptr(4096);
        table_add(*out, 0, cur_host_dev() < 0 ? 0 : cur_host_dev());
        return CUDA_SUCCESS;
    }
    return alloc_on(cur_host_dev(), total, out);
}

API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    NEED_INIT();
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long k;
    CUresult r = array_alloc(d->Width, d->Height, 0, d->Format, d->NumChannels, 0, 1, &k);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

API CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY_DESCRIPTOR n = {d->Width, d->Height, d->Format, d->NumChannels};
    return cuArrayCreate_v2(a, &n);
}

API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    NEED_INIT();
    if (!a || !d)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long k;
    CUresult r = array_alloc(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, 1, &k);
    if (r == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)k;
    return r;
}

API CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR n = {d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
    return cuArray3DCreate_v2(a, &n);
}

API CUresult cuArrayDestroy(CUarray a)
{
    NEED_INIT();
    return free_key((unsigned long long)(uintptr_t)a) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    NEED_INIT();
    if (!m || !d || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long k;
    CUresult r = array_alloc(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, levels, &k);
    if (r == CUDA_SUCCESS)
        *m = (CUmipmappedArray)(uintptr_t)k;
    return r;
}

API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    NEED_INIT();
    return free_key((unsigned long long)(uintptr_t)m) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- virtual memory management ---- */
#define GRANULARITY (2ull << 20)

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
    (void)prop;
    (void)option;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *hdl, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags)
{
    NEED_INIT();
    (void)flags;
    if (!hdl || !prop || size == 0 || size % GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_NOT_SUPPORTED;
    return alloc_on(host_dev(prop->location.id), size, hdl);
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle hdl)
{
    NEED_INIT();
    return free_key(hdl);
}

/* ---- stream-ordered allocation ---- */

API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
    NEED_INIT();
    if (!pool || host_dev(d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&F.default_pool[d];
    return CUDA_SUCCESS;
}

API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    NEED_INIT();
    if (!pool || !props || host_dev(props->location.id) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_pool *p = malloc(sizeof(*p));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->ordinal = props->location.id;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    NEED_INIT();
    for (int i = 0; i < FG_MAX_DEV; i++)
        if ((void *)pool == (void *)&F.default_pool[i])
            return CUDA_ERROR_INVALID_VALUE;
    free(pool);
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream st)
{
    NEED_INIT();
    (void)st;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on(cur_host_dev(), size, p);
}
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream st)
{
    F.n_ptsz++;
    return cuMemAllocAsync(p, size, st);
}

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream st)
{
    NEED_INIT();
    (void)st;
    if (!p || !pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on(host_dev(((struct fake_pool *)pool)->ordinal), size, p);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream st)
{
    F.n_ptsz++;
    return cuMemAllocFromPoolAsync(p, size, pool, st);
}

API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream st)
{
    NEED_INIT();
    (void)st;
    return free_key(p);
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream st)
{
    F.n_ptsz++;
    return cuMemFreeAsync(p, st);
}

API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    NEED_INIT();
    if (!data || attr != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&F.mu);
    for (size_t i = 0; i < F.nallocs; i++) {
        if (F.allocs[i].key == p) {
            int h = F.allocs[i].hostdev;
            pthread_mutex_unlock(&F.mu);
            for (int o = 0; o < F.nvis; o++)
                if (F.vis[o] == h)
                    *(int *)data = o;
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&F.mu);
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- contexts ---- */

static void ctx_charge(int ordinal, int sign)
{
    int h = host_dev(ordinal);
    uint64_t b = F.s->ctx_bytes;
    if (h < 0)
        return;
    fg_lock(F.s); /* NVML lists a process while it has a context on the device, whatever its memory */
    F.s->proc[F.slot].ctxs[h] += sign;
    fg_unlock(F.s);
    if (b == 0)
        return;
    if (sign > 0)
        pool_take(h, b);
    else
        pool_give(h, b);
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    NEED_INIT();
    if (!c || host_dev(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&F.mu);
    int first = F.prim_refs[d]++ == 0;
    F.prim[d].alive = 1;
    pthread_mutex_unlock(&F.mu);
    if (first)
        ctx_charge(d, +1);
    *c = (CUcontext)&F.prim[d];
    return CUDA_SUCCESS;
}

static CUresult prim_release(CUdevice d)
{
    NEED_INIT();
    if (host_dev(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&F.mu);
    int last = F.prim_refs[d] > 0 && --F.prim_refs[d] == 0;
    pthread_mutex_unlock(&F.mu);
    if (last)
        ctx_charge(d, -1);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return prim_release(d); }
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return prim_release(d); }

API CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d)
{
    NEED_INIT();
    (void)flags;
    if (!c || host_dev(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_ctx *x = calloc(1, sizeof(*x));
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->ordinal = d;
    x->alive = 1;
    ctx_charge(d, +1);
    cur_ctx = x;
    *c = (CUcontext)x;
    return CUDA_SUCCESS;
}

API CUresult cuCtxDestroy_v2(CUcontext c)
{
    NEED_INIT();
    struct fake_ctx *x = (struct fake_ctx *)c;
    if (!x || x->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_charge(x->ordinal, -1);
    x->alive = 0;
    if (cur_ctx == x)
        cur_ctx = NULL;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext c)
{
    NEED_INIT();
    cur_ctx = (struct fake_ctx *)c;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *c)
{
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    *c = (CUcontext)cur_ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cur_ctx || !cur_ctx->alive)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = cur_ctx->ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetApiVersion(CUcontext c, unsigned int *v)
{
    NEED_INIT();
    (void)c;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 3020;
    return CUDA_SUCCESS;
}

static CUresult sync_dev(void)
{
    NEED_INIT();
    int h = cur_host_dev();
    if (h < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t end = __atomic_load_n(&F.s->proc[F.slot].last_end[h], __ATOMIC_ACQUIRE);
    if (end > fg_now_ns())
        fg_sleep_until(end);
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void) { return sync_dev(); }
API CUresult cuStreamSynchronize(CUstream s)
{
    (void)s;
    return sync_dev();
}
API CUresult cuStreamSynchronize_ptsz(CUstream s)
{
    (void)s;
    return sync_dev();
}

API CUresult cuGetErrorString(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
    case CUDA_SUCCESS:
        *s = "no error";
        break;
    case CUDA_ERROR_OUT_OF_MEMORY:
        *s = "out of memory";
        break;
    case CUDA_ERROR_NOT_PERMITTED:
        *s = "operation not permitted";
        break;
    default:
        *s = "fake error";
    }
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

/* ---- modules and launches ---- */

static char fake_module, fake_function;

API CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    NEED_INIT();
    if (!m || !image)
        return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)&fake_module;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    NEED_INIT();
    if (!f || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    *f = (CUfunction)&fake_function;
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(CUmodule m)
{
    (void)m;
    return CUDA_SUCCESS;
}

static CUresult run_blocks(uint64_t blocks)
{
    NEED_INIT();
    int h = cur_host_dev();
    if (h < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (blocks == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&F.qmu);
    uint64_t oldest = F.ring[F.qhead];
    if (oldest > fg_now_ns())
        fg_sleep_until(oldest); /* the launch queue is full: block like a real driver */
    uint64_t dur = blocks * F.block_ns;
    if (F.jitter) {
        F.rng ^= F.rng << 13;
        F.rng ^= F.rng >> 7;
        F.rng ^= F.rng << 17;
        int64_t pct = (int64_t)(F.rng % (2 * F.jitter + 1)) - (int64_t)F.jitter;
        dur = (uint64_t)((int64_t)dur + (int64_t)dur * pct / 100);
    }
    fg_lock(F.s);
    uint64_t end = fg_schedule(F.s, h, F.slot, dur);
    fg_unlock(F.s);
    F.ring[F.qhead] = end;
    F.qhead = (F.qhead + 1) % F.qlen;
    pthread_mutex_unlock(&F.qmu);
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    return run_blocks((uint64_t)gx * gy * gz);
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shm, CUstream st, void **params, void **extra)
{
    (void)bx, (void)by, (void)bz, (void)shm, (void)st, (void)params, (void)extra;
    __atomic_fetch_add(&F.n_legacy, 1, __ATOMIC_RELAXED);
    return launch(f, gx, gy, gz);
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shm, CUstream st, void **params, void **extra)
{
    (void)bx, (void)by, (void)bz, (void)shm, (void)st, (void)params, (void)extra;
    __atomic_fetch_add(&F.n_ptsz, 1, __ATOMIC_RELAXED);
    return launch(f, gx, gy, gz);
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)params, (void)extra;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&F.n_ex, 1, __ATOMIC_RELAXED);
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ);
}

API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    __atomic_fetch_add(&F.n_ptsz, 1, __ATOMIC_RELAXED);
    return cuLaunchKernelEx(c, f, params, extra);
}

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shm, CUstream st, void **params)
{
    (void)bx, (void)by, (void)bz, (void)shm, (void)st, (void)params;
    __atomic_fetch_add(&F.n_coop, 1, __ATOMIC_RELAXED);
    return launch(f, gx, gy, gz);
}

API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shm, CUstream st, void **params)
{
    __atomic_fetch_add(&F.n_ptsz, 1, __ATOMIC_RELAXED);
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, st, params);
}

API CUresult cuLaunch(CUfunction f)
{
    __atomic_fetch_add(&F.n_legacy, 1, __ATOMIC_RELAXED);
    return launch(f, 1, 1, 1);
}

API CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
    __atomic_fetch_add(&F.n_legacy, 1, __ATOMIC_RELAXED);
    return launch(f, (unsigned)w, (unsigned)h, 1);
}

API CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream st)
{
    (void)st;
    __atomic_fetch_add(&F.n_legacy, 1, __ATOMIC_RELAXED);
    return launch(f, (unsigned)w, (unsigned)h, 1);
}

API CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    NEED_INIT();
    (void)flags;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    *g = (CUgraph)calloc(1, sizeof(struct fake_graph));
    return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuGraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                  const CUDA_KERNEL_NODE_PARAMS *p)
{
    NEED_INIT();
    (void)deps, (void)ndeps;
    if (!n || !g || !p)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_graph *fg = (struct fake_graph *)g;
    fg->blocks += (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ;
    fg->nodes++;
    *n = (CUgraphNode)(uintptr_t)fg->nodes;
    return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    NEED_INIT();
    (void)flags;
    if (!e || !g)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_graph *x = malloc(sizeof(*x));
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *x = *(struct fake_graph *)g;
    *e = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec e, CUstream st)
{
    (void)st;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    __atomic_fetch_add(&F.n_graph, 1, __ATOMIC_RELAXED);
    return run_blocks(((struct fake_graph *)e)->blocks);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream st)
{
    __atomic_fetch_add(&F.n_ptsz, 1, __ATOMIC_RELAXED);
    return cuGraphLaunch(e, st);
}

API CUresult cuGraphExecDestroy(CUgraphExec e)
{
    free(e);
    return CUDA_SUCCESS;
}

API CUresult cuGraphDestroy(CUgraph g)
{
    free(g);
    return CUDA_SUCCESS;
}

/* ---- test-only entry points ---- */

API CUresult fakegpu_alloc_untracked(CUdeviceptr *p, size_t size)
{
    NEED_INIT();
    return alloc_on(cur_host_dev(), size, p);
}

API void fakegpu_counters(unsigned long long *legacy, unsigned long long *ptsz, unsigned long long *graph,
                          unsigned long long *coop, unsigned long long *ex)
{
    *legacy = F.n_legacy;
    *ptsz = F.n_ptsz;
    *graph = F.n_graph;
    *coop = F.n_coop;
    *ex = F.n_ex;
}

/* Pool bytes in use on visible device `ordinal` (all processes). */
API unsigned long long fakegpu_pool_used(int ordinal)
{
    int h = host_dev(ordinal);
    return h < 0 ? 0 : __atomic_load_n(&F.s->dev[h].used, __ATOMIC_RELAXED);
}

/* ---- cuGetProcAddress ---- */

struct entry {
    const char *base;
    int version;
    int ptsz;
    void *fn;
};

API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status);

#define E(base, ver, fn) {base, ver, 0, (void *)fn}
#define P(base, ver, fn) {base, ver, 1, (void *)fn}
static const struct entry TABLE[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxGetApiVersion", 3020, cuCtxGetApiVersion),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuMemGetInfo", 2000, cuMemGetInfo),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemAlloc", 2000, cuMemAlloc),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 2000, cuMemAllocPitch),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemFree", 2000, cuMemFree),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuArrayCreate", 2000, cuArrayCreate),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 2000, cuArray3DCreate),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemAllocAsync", 11020, cuMemAllocAsync),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    E("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuLaunchKernel", 4000, cuLaunchKernel),
    P("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    E("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
    E("cuLaunch", 2000, cuLaunch),
    E("cuLaunchGrid", 2000, cuLaunchGrid),
    E("cuLaunchGridAsync", 2000, cuLaunchGridAsync),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    E("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static CUresult lookup(const char *sym, void **pfn, int ver, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (!sym || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_shared *s = F.s ? F.s : fg_attach(NULL);
    int drv = s ? s->driver_version : 13000;
    if (ver > drv)
        return CUDA_ERROR_INVALID_VALUE;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct entry *best = NULL, *best_ptsz = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof(TABLE) / sizeof(TABLE[0]); i++) {
        const struct entry *e = &TABLE[i];
        if (strcmp(e->base, sym) != 0)
            continue;
        known = 1;
        if (e->version > ver)
            continue;
        if (e->ptsz) {
            if (!best_ptsz || e->version >= best_ptsz->version)
                best_ptsz = e;
        } else if (!best || e->version >= best->version) {
            best = e;
        }
    }
    if (want_ptsz && best_ptsz)
        best = best_ptsz;
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                       : (known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_SUCCESS;
}

/* The CUDA 11.x entry point: not found is an error. */
API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
    CUresult r = lookup(sym, pfn, ver, flags, NULL);
    if (r == CUDA_SUCCESS && *pfn == NULL)
        return CUDA_ERROR_NOT_FOUND;
    return r;
}

/* The CUDA 12+ entry point: success with a NULL pointer and a status. */
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    return lookup(sym, pfn, ver, flags, status);
}

/* Test-only: the fake's own function for an exported name, bypassing any
 * interposer (the benchmark calls the driver directly through this). */
API void *fakegpu_lookup(const char *name)
{
    static const struct {
        const char *name;
        void *fn;
    } extra[] = {
        {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
        {"cuMemFree_v2", (void *)cuMemFree_v2},
        {"cuLaunchKernel", (void *)cuLaunchKernel},
    };
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
        if (strcmp(extra[i].name, name) == 0)
            return extra[i].fn;
    return NULL;
}
