/* LD_PRELOAD only: the CUDA runtime and NVML users (nvidia-smi, pynvml) open
 * libcuda/libnvidia-ml with dlopen and look entry points up with
 * dlsym(handle, ...), which never sees preloaded libraries. This dlsym hands
 * out the shim's wrapper when such a lookup lands on a hooked function of the
 * real driver, and otherwise behaves exactly like glibc's: other names go
 * straight to the real dlsym as a tail call, so RTLD_NEXT still resolves
 * relative to the real caller. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "vc_hooks.h"
#include "vc_loader.h"

static void *hooked(void *handle, const char *name)
{
    const struct vc_hook *h = vc_hook_by_name(name);
    if (!h)
        return NULL;
    if (h->nvml ? vc_loader_nvml() != 0 : vc_loader_cuda() != 0)
        return NULL;
    void *r = vc_real_dlsym(handle, name);
    if (r && r != h->wrapper && vc_addr_in_real(r))
        return h->wrapper;
    return NULL;
}

#pragma GCC diagnostic ignored "-Wnonnull-compare"
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
    if (handle != RTLD_NEXT && name && ((name[0] == 'c' && name[1] == 'u') ||
                                        (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l'))) {
        void *w = hooked(handle, name);
        if (w)
            return w;
    }
    return vc_real_dlsym(handle, name);
}
