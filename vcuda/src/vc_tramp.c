/* Resolution of the drop-in flavour's pass-through entry points. */
#define _GNU_SOURCE
#include <stdint.h>

#include "vc_common.h"
#include "vc_loader.h"
#include "vc_log.h"

#define VC_SURFACE(name) #name,
static const char *const cuda_names[] = {
#include "vc_surface_cuda.inc"
};
static const char *const nvml_names[] = {
#include "vc_surface_nvml.inc"
};
#undef VC_SURFACE

#define N_CUDA (sizeof(cuda_names) / sizeof(cuda_names[0]))
#define N_NVML (sizeof(nvml_names) / sizeof(nvml_names[0]))

__attribute__((visibility("hidden"))) void *vc_tramp_table[N_CUDA + N_NVML];

static CUresult missing_cuda(void)
{
    return CUDA_ERROR_NOT_FOUND;
}

static nvmlReturn_t missing_nvml(void)
{
    return NVML_ERROR_FUNCTION_NOT_FOUND;
}

__attribute__((visibility("hidden"))) void *vc_tramp_resolve(unsigned idx)
{
    void *p = NULL;
    const char *name;
    if (idx < N_CUDA) {
        name = cuda_names[idx];
        if (vc_loader_cuda() == 0)
            p = vc_real_cuda_sym(name);
        if (!p)
            p = (void *)missing_cuda;
    } else if (idx < N_CUDA + N_NVML) {
        name = nvml_names[idx - N_CUDA];
        if (vc_loader_nvml() == 0)
            p = vc_real_nvml_sym(name);
        if (!p)
            p = (void *)missing_nvml;
    } else {
        return (void *)missing_cuda;
    }
    if (p == (void *)missing_cuda || p == (void *)missing_nvml)
        VC_DEBUG("%s is not in the real library; it answers 'not found'", name);
    __atomic_store_n(&vc_tramp_table[idx], p, __ATOMIC_RELEASE);
    return p;
}
