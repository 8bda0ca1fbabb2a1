/* Function pointer types of every real driver function the shim calls. */
#ifndef VC_PFN_H
#define VC_PFN_H

#include "vc_common.h"
#include "vc_hooks.h"

typedef CUresult ft_cuInit(unsigned int);
typedef ft_cuInit *pfn_cuInit;
typedef CUresult ft_cuGetProcAddress(const char *, void **, int, cuuint64_t);
typedef ft_cuGetProcAddress *pfn_cuGetProcAddress;
typedef CUresult ft_cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef ft_cuGetProcAddress_v2 *pfn_cuGetProcAddress_v2;
typedef CUresult ft_cuMemAlloc(CUdeviceptr_v1 *, unsigned int);
typedef ft_cuMemAlloc *pfn_cuMemAlloc;
typedef CUresult ft_cuMemAlloc_v2(CUdeviceptr *, size_t);
typedef ft_cuMemAlloc_v2 *pfn_cuMemAlloc_v2;
typedef CUresult ft_cuMemAllocPitch(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
typedef ft_cuMemAllocPitch *pfn_cuMemAllocPitch;
typedef CUresult ft_cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef ft_cuMemAllocPitch_v2 *pfn_cuMemAllocPitch_v2;
typedef CUresult ft_cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
typedef ft_cuMemAllocManaged *pfn_cuMemAllocManaged;
typedef CUresult ft_cuMemFree(CUdeviceptr_v1);
typedef ft_cuMemFree *pfn_cuMemFree;
typedef CUresult ft_cuMemFree_v2(CUdeviceptr);
typedef ft_cuMemFree_v2 *pfn_cuMemFree_v2;
typedef CUresult ft_cuArrayCreate(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *);
typedef ft_cuArrayCreate *pfn_cuArrayCreate;
typedef CUresult ft_cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef ft_cuArrayCreate_v2 *pfn_cuArrayCreate_v2;
typedef CUresult ft_cuArray3DCreate(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *);
typedef ft_cuArray3DCreate *pfn_cuArray3DCreate;
typedef CUresult ft_cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef ft_cuArray3DCreate_v2 *pfn_cuArray3DCreate_v2;
typedef CUresult ft_cuArrayDestroy(CUarray);
typedef ft_cuArrayDestroy *pfn_cuArrayDestroy;
typedef CUresult ft_cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef ft_cuMipmappedArrayCreate *pfn_cuMipmappedArrayCreate;
typedef CUresult ft_cuMipmappedArrayDestroy(CUmipmappedArray);
typedef ft_cuMipmappedArrayDestroy *pfn_cuMipmappedArrayDestroy;
typedef CUresult ft_cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                    unsigned long long);
typedef ft_cuMemCreate *pfn_cuMemCreate;
typedef CUresult ft_cuMemRelease(CUmemGenericAllocationHandle);
typedef ft_cuMemRelease *pfn_cuMemRelease;
typedef CUresult ft_cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
typedef ft_cuMemAllocAsync *pfn_cuMemAllocAsync;
typedef CUresult ft_cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
typedef ft_cuMemAllocAsync_ptsz *pfn_cuMemAllocAsync_ptsz;
typedef CUresult ft_cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef ft_cuMemAllocFromPoolAsync *pfn_cuMemAllocFromPoolAsync;
typedef CUresult ft_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef ft_cuMemAllocFromPoolAsync_ptsz *pfn_cuMemAllocFromPoolAsync_ptsz;
typedef CUresult ft_cuMemFreeAsync(CUdeviceptr, CUstream);
typedef ft_cuMemFreeAsync *pfn_cuMemFreeAsync;
typedef CUresult ft_cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
typedef ft_cuMemFreeAsync_ptsz *pfn_cuMemFreeAsync_ptsz;
typedef CUresult ft_cuMemGetInfo(unsigned int *, unsigned int *);
typedef ft_cuMemGetInfo *pfn_cuMemGetInfo;
typedef CUresult ft_cuMemGetInfo_v2(size_t *, size_t *);
typedef ft_cuMemGetInfo_v2 *pfn_cuMemGetInfo_v2;
typedef CUresult ft_cuDeviceTotalMem(unsigned int *, CUdevice);
typedef ft_cuDeviceTotalMem *pfn_cuDeviceTotalMem;
typedef CUresult ft_cuDeviceTotalMem_v2(size_t *, CUdevice);
typedef ft_cuDeviceTotalMem_v2 *pfn_cuDeviceTotalMem_v2;
typedef CUresult ft_cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, CUstream, void **, void **);
typedef ft_cuLaunchKernel *pfn_cuLaunchKernel;
typedef ft_cuLaunchKernel ft_cuLaunchKernel_ptsz;
typedef ft_cuLaunchKernel_ptsz *pfn_cuLaunchKernel_ptsz;
typedef CUresult ft_cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
typedef ft_cuLaunchKernelEx *pfn_cuLaunchKernelEx;
typedef ft_cuLaunchKernelEx ft_cuLaunchKernelEx_ptsz;
typedef ft_cuLaunchKernelEx_ptsz *pfn_cuLaunchKernelEx_ptsz;
typedef CUresult ft_cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                                  unsigned, unsigned, CUstream, void **);
typedef ft_cuLaunchCooperativeKernel *pfn_cuLaunchCooperativeKernel;
typedef ft_cuLaunchCooperativeKernel ft_cuLaunchCooperativeKernel_ptsz;
typedef ft_cuLaunchCooperativeKernel_ptsz *pfn_cuLaunchCooperativeKernel_ptsz;
typedef CUresult ft_cuLaunch(CUfunction);
typedef ft_cuLaunch *pfn_cuLaunch;
typedef CUresult ft_cuLaunchGrid(CUfunction, int, int);
typedef ft_cuLaunchGrid *pfn_cuLaunchGrid;
typedef CUresult ft_cuLaunchGridAsync(CUfunction, int, int, CUstream);
typedef ft_cuLaunchGridAsync *pfn_cuLaunchGridAsync;
typedef CUresult ft_cuGraphLaunch(CUgraphExec, CUstream);
typedef ft_cuGraphLaunch *pfn_cuGraphLaunch;
typedef ft_cuGraphLaunch ft_cuGraphLaunch_ptsz;
typedef ft_cuGraphLaunch_ptsz *pfn_cuGraphLaunch_ptsz;

typedef CUresult ft_cuDeviceGetCount(int *);
typedef ft_cuDeviceGetCount *pfn_cuDeviceGetCount;
typedef CUresult ft_cuDeviceGet(CUdevice *, int);
typedef ft_cuDeviceGet *pfn_cuDeviceGet;
typedef CUresult ft_cuDeviceGetUuid(CUuuid *, CUdevice);
typedef ft_cuDeviceGetUuid *pfn_cuDeviceGetUuid;
typedef CUresult ft_cuDeviceGetUuid_v2(CUuuid *, CUdevice);
typedef ft_cuDeviceGetUuid_v2 *pfn_cuDeviceGetUuid_v2;
typedef CUresult ft_cuDeviceGetAttribute(int *, int, CUdevice);
typedef ft_cuDeviceGetAttribute *pfn_cuDeviceGetAttribute;
typedef CUresult ft_cuCtxGetDevice(CUdevice *);
typedef ft_cuCtxGetDevice *pfn_cuCtxGetDevice;

typedef nvmlReturn_t ft_nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
typedef ft_nvmlDeviceGetMemoryInfo *pfn_nvmlDeviceGetMemoryInfo;
typedef nvmlReturn_t ft_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
typedef ft_nvmlDeviceGetMemoryInfo_v2 *pfn_nvmlDeviceGetMemoryInfo_v2;
typedef nvmlReturn_t ft_nvmlInit_v2(void);
typedef ft_nvmlInit_v2 *pfn_nvmlInit_v2;
typedef nvmlReturn_t ft_nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
typedef ft_nvmlDeviceGetHandleByUUID *pfn_nvmlDeviceGetHandleByUUID;
typedef nvmlReturn_t ft_nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);
typedef ft_nvmlDeviceGetUUID *pfn_nvmlDeviceGetUUID;
typedef nvmlReturn_t ft_nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
                                                            unsigned int *, unsigned long long);
typedef ft_nvmlDeviceGetProcessUtilization *pfn_nvmlDeviceGetProcessUtilization;
typedef nvmlReturn_t ft_nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);
typedef ft_nvmlDeviceGetUtilizationRates *pfn_nvmlDeviceGetUtilizationRates;
typedef nvmlReturn_t ft_nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
typedef ft_nvmlDeviceGetComputeRunningProcesses_v3 *pfn_nvmlDeviceGetComputeRunningProcesses_v3;
typedef nvmlReturn_t ft_nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
typedef ft_nvmlDeviceGetComputeRunningProcesses_v2 *pfn_nvmlDeviceGetComputeRunningProcesses_v2;
typedef nvmlReturn_t ft_nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned int *,
                                                                 nvmlProcessInfo_v1_t *);
typedef ft_nvmlDeviceGetComputeRunningProcesses *pfn_nvmlDeviceGetComputeRunningProcesses;
typedef nvmlReturn_t ft_nvmlDeviceIsMigDeviceHandle(nvmlDevice_t, unsigned int *);
typedef ft_nvmlDeviceIsMigDeviceHandle *pfn_nvmlDeviceIsMigDeviceHandle;
typedef nvmlReturn_t ft_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t, nvmlDevice_t *);
typedef ft_nvmlDeviceGetDeviceHandleFromMigDeviceHandle *pfn_nvmlDeviceGetDeviceHandleFromMigDeviceHandle;
typedef nvmlReturn_t ft_nvmlDeviceGetGpuInstanceId(nvmlDevice_t, unsigned int *);
typedef ft_nvmlDeviceGetGpuInstanceId *pfn_nvmlDeviceGetGpuInstanceId;
typedef nvmlReturn_t ft_nvmlGpmQueryDeviceSupport(nvmlDevice_t, nvmlGpmSupport_t *);
typedef ft_nvmlGpmQueryDeviceSupport *pfn_nvmlGpmQueryDeviceSupport;
typedef nvmlReturn_t ft_nvmlGpmSampleAlloc(nvmlGpmSample_t *);
typedef ft_nvmlGpmSampleAlloc *pfn_nvmlGpmSampleAlloc;
typedef nvmlReturn_t ft_nvmlGpmMigSampleGet(nvmlDevice_t, unsigned int, nvmlGpmSample_t);
typedef ft_nvmlGpmMigSampleGet *pfn_nvmlGpmMigSampleGet;
typedef nvmlReturn_t ft_nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *);
typedef ft_nvmlGpmMetricsGet *pfn_nvmlGpmMetricsGet;

/* The exported hooks, declared with the driver's own signatures. */
#define VC_DECLARE_HOOK(name, base, ver, ptsz) VC_EXPORT ft_##name name;
VC_CUDA_HOOKS(VC_DECLARE_HOOK)
VC_NVML_HOOKS(VC_DECLARE_HOOK)
#undef VC_DECLARE_HOOK

#endif
