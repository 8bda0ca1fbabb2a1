/* Helpers shared by the shim's test programs (driver API calls against the
 * fake libcuda.so.1, with or without libvcuda in front). */
#ifndef TESTLIB_H
#define TESTLIB_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vc_cuda.h"
#include "vc_nvml.h"

/* Driver API (the subset the tests call), linked against libcuda.so.1. */
CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetUuid(CUuuid *, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDeviceTotalMem(unsigned int *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuCtxGetApiVersion(CUcontext, unsigned int *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemGetInfo(unsigned int *, unsigned int *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAlloc(CUdeviceptr_v1 *, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFree(CUdeviceptr_v1);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void **);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuStreamSynchronize(CUstream);

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);

/* Test-only entry points of the fake driver, found at run time: in the
 * global scope when the fake is linked in front, else in the copy the shim
 * opened itself (drop-in mode; VCTEST_FAKE names it). */
static inline void *t_fake_sym(const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    const char *path = getenv("VCTEST_FAKE");
    if (!p && path) {
        void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        p = h ? dlsym(h, name) : NULL;
    }
    if (!p) {
        printf("FAIL test-only symbol %s not found\n", name);
        exit(1);
    }
    return p;
}

static inline CUresult fakegpu_alloc_untracked(CUdeviceptr *p, size_t n)
{
    return ((CUresult(*)(CUdeviceptr *, size_t))t_fake_sym("fakegpu_alloc_untracked"))(p, n);
}

static inline void fakegpu_counters(unsigned long long *a, unsigned long long *b, unsigned long long *c,
                                    unsigned long long *d, unsigned long long *e)
{
    ((void (*)(unsigned long long *, unsigned long long *, unsigned long long *, unsigned long long *,
               unsigned long long *))t_fake_sym("fakegpu_counters"))(a, b, c, d, e);
}

static inline unsigned long long fakegpu_pool_used(int ordinal)
{
    return ((unsigned long long (*)(int))t_fake_sym("fakegpu_pool_used"))(ordinal);
}

static int t_failures __attribute__((unused));

#define EXPECT(cond, ...)                                                                              \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                \
            printf(__VA_ARGS__);                                                                       \
            printf("\n");                                                                              \
            fflush(stdout);                                                                            \
            t_failures++;                                                                              \
        }                                                                                              \
    } while (0)

#define EXPECT_RC(call, want)                                                                          \
    do {                                                                                               \
        CUresult r_ = (call);                                                                          \
        EXPECT(r_ == (want), "%s returned %d, expected %d", #call, r_, (int)(want));                   \
    } while (0)

#define MiB (1024ull * 1024ull)

static inline void t_uuid(const CUuuid *u, char *out, size_t cap)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* cuInit + primary context of device `ordinal` made current. */
static inline int t_setup(int ordinal)
{
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        printf("cuInit=%d\n", r);
        fflush(stdout);
        return r;
    }
    CUdevice d;
    CUcontext c;
    if (cuDeviceGet(&d, ordinal) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&c, d) != CUDA_SUCCESS ||
        cuCtxSetCurrent(c) != CUDA_SUCCESS) {
        printf("context setup failed\n");
        return -1;
    }
    return 0;
}

/* Bytes the container uses on the current device, as cuMemGetInfo tells it. */
static inline unsigned long long t_used(void)
{
    size_t f = 0, t = 0;
    if (cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS)
        return ~0ull;
    return (unsigned long long)(t - f);
}

static inline double t_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void t_wait_for_file(const char *path, double timeout_s)
{
    double end = t_now() + timeout_s;
    while (access(path, F_OK) != 0 && t_now() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

#endif
