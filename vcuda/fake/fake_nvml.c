/* Fake libnvidia-ml.so.1 over the simulated node in fake_state.c: memory of
 * each device, the processes using it, and per-process SM utilisation per
 * sampling period, as the real NVML reports them. NVML sees every device of
 * the node (it ignores CUDA_VISIBLE_DEVICES, as the real one does).
 *
 * MIG: a device of the state whose UUID is "MIG-..." and that names a parent
 * card and GPU instance ID is a MIG device (its own timeline: an instance's
 * SMs are its own). Its handle answers IsMigDeviceHandle, GetGpuInstanceId
 * and GetDeviceHandleFromMigDeviceHandle; the parent card is a handle of its
 * own (found by its UUID), not counted as a CUDA device. Per-process and
 * device utilisation are NOT_SUPPORTED on MIG handles, as on a real
 * MIG-enabled card. GPM (fake_gpm.inc) is there on Hopper and later. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_state.h"
#include "vc_nvml.h"

#define API __attribute__((visibility("default")))

struct nvdev {
    int index;
};

#define PARENT_BASE 1000 /* a parent card's nvdev index: PARENT_BASE + its number */

static struct {
    pthread_mutex_t mu;
    struct fg_shared *s;
    int refs;
    struct nvdev devs[FG_MAX_DEV];
    struct nvdev parents[FG_MAX_DEV]; /* cards holding the MIG devices of the state */
    int nparents;
    int parent_of[FG_MAX_DEV];       /* per device: its parent's number, -1 when not a MIG device */
    int no_proc_util; /* FAKEGPU_NVML_PROC_UTIL=unsupported: per-process utilisation NOT_SUPPORTED */
    int no_dev_util;  /* FAKEGPU_NVML_DEV_UTIL=unsupported: device utilisation NOT_SUPPORTED */
    int no_handles;   /* FAKEGPU_NVML_HANDLES=unsupported: this process's NVML finds no device by UUID */
} N = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int unsupported(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "unsupported") == 0;
}

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&N.mu);
    if (!N.s)
        N.s = fg_attach(NULL);
    if (!N.s) {
        pthread_mutex_unlock(&N.mu);
        return NVML_ERROR_UNKNOWN;
    }
    for (int i = 0; i < FG_MAX_DEV; i++)
        N.devs[i].index = i;
    N.nparents = 0;
    for (int i = 0; i < N.s->ndev && i < FG_MAX_DEV; i++) {
        N.parent_of[i] = -1;
        if (!N.s->dev[i].parent[0] || strncmp(N.s->dev[i].uuid, "MIG-", 4) != 0)
            continue;
        int found = -1;
        for (int j = 0; j < i; j++)
            if (N.parent_of[j] >= 0 && strcmp(N.s->dev[j].parent, N.s->dev[i].parent) == 0)
                found = N.parent_of[j];
        if (found < 0) {
            found = N.nparents++;
            N.parents[found].index = PARENT_BASE + found;
        }
        N.parent_of[i] = found;
    }
    N.no_proc_util = unsupported("FAKEGPU_NVML_PROC_UTIL");
    N.no_dev_util = unsupported("FAKEGPU_NVML_DEV_UTIL");
    N.no_handles = unsupported("FAKEGPU_NVML_HANDLES");
    N.refs++;
    pthread_mutex_unlock(&N.mu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit(void) { return init(); }
API nvmlReturn_t nvmlInit_v2(void) { return init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&N.mu);
    if (N.refs == 0) {
        pthread_mutex_unlock(&N.mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    N.refs--;
    pthread_mutex_unlock(&N.mu);
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    default:
        return "Fake NVML error";
    }
}

#define NEED_INIT()                                                                                    \
    do {                                                                                               \
        if (N.refs == 0)                                                                               \
            return NVML_ERROR_UNINITIALIZED;                                                           \
    } while (0)

static int dev_index(nvmlDevice_t d)
{
    struct nvdev *x = (struct nvdev *)d;
    if (!x || x < &N.devs[0] || x >= &N.devs[FG_MAX_DEV] || x->index >= N.s->ndev)
        return -1;
    return x->index;
}

/* A parent card's number, -1 if d is not a parent handle. */
static int parent_index(nvmlDevice_t d)
{
    struct nvdev *x = (struct nvdev *)d;
    if (!x || x < &N.parents[0] || x >= &N.parents[FG_MAX_DEV] || x - &N.parents[0] >= N.nparents)
        return -1;
    return (int)(x - &N.parents[0]);
}

/* The first MIG device of parent card p (its UUID and architecture are the card's). */
static int first_child(int p)
{
    for (int i = 0; i < N.s->ndev; i++)
        if (N.parent_of[i] == p)
            return i;
    return -1;
}

static int is_mig(int i)
{
    return i >= 0 && N.parent_of[i] >= 0;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int len)
{
    NEED_INIT();
    if (!buf || len == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(buf, len, "999.99.99");
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    NEED_INIT();
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned int)N.s->ndev;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    NEED_INIT();
    if (!d || (int)i >= N.s->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)&N.devs[i];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d)
{
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    NEED_INIT();
    if (!uuid || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (N.no_handles)
        return NVML_ERROR_NOT_FOUND;
    for (int i = 0; i < N.s->ndev; i++) {
        if (strcmp(N.s->dev[i].uuid, uuid) == 0) {
            *d = (nvmlDevice_t)&N.devs[i];
            return NVML_SUCCESS;
        }
    }
    for (int p = 0; p < N.nparents; p++) {
        if (strcmp(N.s->dev[first_child(p)].parent, uuid) == 0) {
            *d = (nvmlDevice_t)&N.parents[p];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len)
{
    NEED_INIT();
    int i = dev_index(d), p = parent_index(d);
    if ((i < 0 && p < 0) || !buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *u = i >= 0 ? N.s->dev[i].uuid : N.s->dev[first_child(p)].parent;
    if (strlen(u) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(buf, len, "%s", u);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *isMig)
{
    NEED_INIT();
    int i = dev_index(d), p = parent_index(d);
    if ((i < 0 && p < 0) || !isMig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = is_mig(i) ? 1u : 0u;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *parent)
{
    NEED_INIT();
    int i = dev_index(mig);
    if (!is_mig(i) || !parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    *parent = (nvmlDevice_t)&N.parents[N.parent_of[i]];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig(i))
        return NVML_ERROR_NOT_SUPPORTED; /* not a MIG device */
    *id = (unsigned int)N.s->dev[i].gi_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
    NEED_INIT();
    int i = dev_index(d), p = parent_index(d);
    if ((i < 0 && p < 0) || !arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    int a = N.s->dev[i >= 0 ? i : first_child(p)].arch;
    *arch = a > 0 ? (unsigned int)a : 0xffffffffu; /* NVML_DEVICE_ARCH_UNKNOWN */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(buf, len, "%s", N.s->dev[i].name);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *idx)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !idx)
        return NVML_ERROR_INVALID_ARGUMENT;
    *idx = (unsigned int)i;
    return NVML_SUCCESS;
}

static void mem_of(int i, unsigned long long *total, unsigned long long *used)
{
    fg_lock(N.s);
    *total = N.s->dev[i].total;
    *used = N.s->dev[i].used;
    fg_unlock(N.s);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    mem_of(i, &m->total, &m->used);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != VC_NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem_of(i, &m->total, &m->used);
    m->reserved = 0;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

static nvmlReturn_t running(nvmlDevice_t d, unsigned int *count, void *infos, size_t stride)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0, cap = *count;
    fg_lock(N.s);
    for (int p = 0; p < FG_MAX_PROC; p++) {
        struct fg_proc *pr = &N.s->proc[p];
        if (pr->pid == 0 || (pr->mem[i] == 0 && pr->ctxs[i] <= 0))
            continue;
        if (infos && n < cap) {
            char *slot = (char *)infos + n * stride;
            memset(slot, 0, stride);
            nvmlProcessInfo_v1_t *x = (nvmlProcessInfo_v1_t *)slot;
            x->pid = (unsigned int)(pr->nvml_pid ? pr->nvml_pid : pr->pid);
            x->usedGpuMemory = pr->mem[i];
        }
        n++;
    }
    fg_unlock(N.s);
    *count = n;
    if (n > cap || (!infos && n > 0))
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *x)
{
    return running(d, c, x, sizeof(*x));
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *x)
{
    return running(d, c, x, sizeof(*x));
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *x)
{
    return running(d, c, x, sizeof(*x));
}

/* One sample per process that had work in the completed sampling periods
 * newer than lastSeen (at most the last 20): its share of those periods. */
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                                                 unsigned int *count, unsigned long long lastSeen)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (N.no_proc_util || is_mig(i))
        return NVML_ERROR_NOT_SUPPORTED; /* some drivers and vGPU guests; MIG devices */
    struct fg_shared *s = N.s;
    uint64_t P = s->period_ns;
    int64_t done = (int64_t)(fg_now_ns() / P); /* periods < done are complete */
    int64_t first = done - 20;
    while (first < done && (unsigned long long)((uint64_t)(first + 1) * P / 1000) <= lastSeen)
        first++;
    unsigned int n = 0, cap = *count;
    if (first < 0)
        first = 0;
    if (first < done) {
        uint64_t sum[FG_MAX_PROC] = {0};
        fg_lock(s);
        for (int64_t per = first; per < done; per++) {
            struct fg_bucket *b = &s->dev[i].buckets[per % FG_BUCKETS];
            if (b->period != per)
                continue;
            for (int p = 0; p < FG_MAX_PROC; p++)
                sum[p] += b->busy[p];
        }
        for (int p = 0; p < FG_MAX_PROC; p++) {
            if (sum[p] == 0 || s->proc[p].pid == 0)
                continue;
            if (out && n < cap) {
                uint64_t span = (uint64_t)(done - first) * P;
                out[n].pid = (unsigned int)(s->proc[p].nvml_pid ? s->proc[p].nvml_pid : s->proc[p].pid);
                out[n].timeStamp = (uint64_t)done * P / 1000;
                out[n].smUtil = (unsigned int)((sum[p] * 100 + span / 2) / span);
                out[n].memUtil = 0;
                out[n].encUtil = 0;
                out[n].decUtil = 0;
            }
            n++;
        }
        fg_unlock(s);
    }
    *count = n;
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!out || n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    NEED_INIT();
    int i = dev_index(d);
    if (i < 0 || !u)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (N.no_dev_util || is_mig(i))
        return NVML_ERROR_NOT_SUPPORTED;
    uint64_t P = N.s->period_ns;
    int64_t per = (int64_t)(fg_now_ns() / P) - 1;
    uint64_t sum = 0;
    fg_lock(N.s);
    struct fg_bucket *b = &N.s->dev[i].buckets[per % FG_BUCKETS];
    if (per >= 0 && b->period == per)
        for (int p = 0; p < FG_MAX_PROC; p++)
            sum += b->busy[p];
    fg_unlock(N.s);
    u->gpu = (unsigned int)(sum * 100 / P);
    u->memory = 0;
    return NVML_SUCCESS;
}

#include "fake_gpm.inc"
