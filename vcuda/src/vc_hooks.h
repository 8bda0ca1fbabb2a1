/* The table of every exported hook: name, the base name cuGetProcAddress
 * knows it by, the CUDA version that introduced that ABI variant, and whether
 * it is the per-thread-default-stream (_ptsz/_ptds) variant.
 * X(name, base, version, ptsz) */
#ifndef VC_HOOKS_H
#define VC_HOOKS_H

#define VC_CUDA_HOOKS(X)                                                                               \
    X(cuInit, cuInit, 2000, 0)                                                                         \
    X(cuGetProcAddress, cuGetProcAddress, 11030, 0)                                                    \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0)                                                 \
    X(cuMemAlloc, cuMemAlloc, 2000, 0)                                                                 \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0)                                                              \
    X(cuMemAllocPitch, cuMemAllocPitch, 2000, 0)                                                       \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0)                                                    \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                                                   \
    X(cuMemFree, cuMemFree, 2000, 0)                                                                   \
    X(cuMemFree_v2, cuMemFree, 3020, 0)                                                                \
    X(cuArrayCreate, cuArrayCreate, 2000, 0)                                                           \
    X(cuArrayCreate_v2, cuArrayCreate, 3020, 0)                                                        \
    X(cuArray3DCreate, cuArray3DCreate, 2000, 0)                                                       \
    X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0)                                                    \
    X(cuArrayDestroy, cuArrayDestroy, 2000, 0)                                                         \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0)                                         \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0)                                       \
    X(cuMemCreate, cuMemCreate, 10020, 0)                                                              \
    X(cuMemRelease, cuMemRelease, 10020, 0)                                                            \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                                                      \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1)                                                 \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)                                      \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1)                                 \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                                                        \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1)                                                   \
    X(cuMemGetInfo, cuMemGetInfo, 2000, 0)                                                             \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0)                                                          \
    X(cuDeviceTotalMem, cuDeviceTotalMem, 2000, 0)                                                     \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0)                                                  \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0)                                                         \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                                                    \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                                                    \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1)                                               \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)                                   \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1)                              \
    X(cuLaunch, cuLaunch, 2000, 0)                                                                     \
    X(cuLaunchGrid, cuLaunchGrid, 2000, 0)                                                             \
    X(cuLaunchGridAsync, cuLaunchGridAsync, 2000, 0)                                                   \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0)                                                          \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1)

#define VC_NVML_HOOKS(X)                                                                               \
    X(nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo, 0, 0)                                          \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMemoryInfo_v2, 0, 0)

/* Real driver functions the shim calls itself without hooking them. */
#define VC_CUDA_INTERNAL(X)                                                                            \
    X(cuDeviceGetCount)                                                                                \
    X(cuDeviceGet)                                                                                     \
    X(cuDeviceGetUuid)                                                                                 \
    X(cuDeviceGetUuid_v2)                                                                              \
    X(cuDeviceGetAttribute)                                                                            \
    X(cuCtxGetDevice)

#define VC_NVML_INTERNAL(X)                                                                            \
    X(nvmlInit_v2)                                                                                     \
    X(nvmlDeviceGetHandleByUUID)                                                                       \
    X(nvmlDeviceGetUUID)                                                                               \
    X(nvmlDeviceGetProcessUtilization)                                                                 \
    X(nvmlDeviceGetUtilizationRates)                                                                   \
    X(nvmlDeviceGetComputeRunningProcesses_v3)                                                         \
    X(nvmlDeviceGetComputeRunningProcesses_v2)                                                         \
    X(nvmlDeviceGetComputeRunningProcesses)                                                            \
    X(nvmlDeviceIsMigDeviceHandle)                                                                     \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)                                                    \
    X(nvmlDeviceGetGpuInstanceId)                                                                      \
    X(nvmlGpmQueryDeviceSupport)                                                                       \
    X(nvmlGpmSampleAlloc)                                                                              \
    X(nvmlGpmMigSampleGet)                                                                             \
    X(nvmlGpmMetricsGet)

enum vc_hook_id {
#define VC_ENUM(name, base, ver, ptsz) VC_H_##name,
    VC_CUDA_HOOKS(VC_ENUM) VC_HOOK_CUDA_END,
    VC_HOOK_NVML_BEGIN = VC_HOOK_CUDA_END - 1,
    VC_NVML_HOOKS(VC_ENUM) VC_HOOK_COUNT
#undef VC_ENUM
};

enum vc_internal_id {
#define VC_ENUM_I(name) VC_I_##name,
    VC_CUDA_INTERNAL(VC_ENUM_I) VC_INTERNAL_CUDA_END,
    VC_INTERNAL_NVML_BEGIN = VC_INTERNAL_CUDA_END - 1,
    VC_NVML_INTERNAL(VC_ENUM_I) VC_INTERNAL_COUNT
#undef VC_ENUM_I
};

struct vc_hook {
    const char *name;
    const char *base;
    int version;
    int ptsz;
    int nvml;
    void *wrapper;
};

/* Every hook, in enum order. */
extern const struct vc_hook vc_hook_table[VC_HOOK_COUNT];
/* Real driver functions, indexed like vc_hook_table / enum vc_internal_id. */
extern void *vc_real[VC_HOOK_COUNT];
extern void *vc_real_internal[VC_INTERNAL_COUNT];

#define REAL(name) ((pfn_##name)vc_real[VC_H_##name])
#define REAL_I(name) ((pfn_##name)vc_real_internal[VC_I_##name])

/* The hook for `name` (exact exported name), or NULL. */
const struct vc_hook *vc_hook_by_name(const char *name);

#endif
