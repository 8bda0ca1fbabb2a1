#define _GNU_SOURCE
#include "vc_loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vc_hooks.h"
#include "vc_log.h"
#include "vc_pfn.h"
#include "vc_settings.h"

void *vc_real[VC_HOOK_COUNT];
void *vc_real_internal[VC_INTERNAL_COUNT];

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT;
static int cuda_ok = -1, nvml_ok = -1;
static void *cuda_handle, *nvml_handle;
static void *cuda_base, *nvml_base;

void *vc_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
    if (VC_UNLIKELY(!f)) {
        /* dlvsym is not interposed; RTLD_NEXT from here reaches libc (or libdl). */
        static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
        for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && !f; i++)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (!f)
            return NULL;
        __atomic_store_n(&real_dlsym_fn, f, __ATOMIC_RELEASE);
    }
    return f(handle, name);
}

static void *base_of(const void *addr)
{
    Dl_info info;
    if (!addr || !dladdr(addr, &info))
        return NULL;
    return info.dli_fbase;
}

static void *self_base(void)
{
    return base_of((const void *)&vc_loader_cuda);
}

static int same_file_as_self(const char *path)
{
    Dl_info info;
    struct stat a, b;
    if (!dladdr((const void *)&vc_loader_cuda, &info) || !info.dli_fname)
        return 0;
    if (stat(info.dli_fname, &a) != 0 || stat(path, &b) != 0)
        return 0;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Open `path` and accept it if it defines `probe` outside this library. */
static void *try_open(const char *path, int flags, const char *probe)
{
    if (strchr(path, '/') && same_file_as_self(path))
        return NULL;
    void *h = dlopen(path, flags);
    if (!h)
        return NULL;
    void *p = vc_real_dlsym(h, probe);
    if (!p || base_of(p) == self_base()) {
        dlclose(h);
        return NULL;
    }
    return h;
}

static void driver_version(char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/proc/driver/nvidia/version", "re");
    if (!f)
        return;
    char line[512];
    if (fgets(line, sizeof(line), f)) {
        /* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." */
        char *p = strstr(line, "Kernel Module");
        if (p) {
            p += strlen("Kernel Module");
            while (*p == ' ')
                p++;
            size_t n = 0;
            while (p[n] && p[n] != ' ' && n + 1 < cap) {
                out[n] = p[n];
                n++;
            }
            out[n] = 0;
        }
    }
    fclose(f);
}

static void *search(const char *stem, const char *probe)
{
    static const char *const std_dirs[] = {
        "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64",
        "/usr/lib/wsl/lib",
    };
    char ver[64];
    driver_version(ver, sizeof(ver));
    char names[3][96];
    int nnames = 0;
    if (ver[0])
        snprintf(names[nnames++], sizeof(names[0]), "%s.%s", stem, ver);
    snprintf(names[nnames++], sizeof(names[0]), "%s.1", stem);
    snprintf(names[nnames++], sizeof(names[0]), "%s", stem);

    const struct vc_settings *s = vc_settings();
    char dirs[4096];
    snprintf(dirs, sizeof(dirs), "%s", s->ld_library_path);
    char *save = NULL;
    char path[1024];
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        for (int n = 0; n < nnames; n++) {
            snprintf(path, sizeof(path), "%s/%s", d, names[n]);
            if (access(path, R_OK) != 0)
                continue;
            void *h = try_open(path, RTLD_NOW | RTLD_LOCAL, probe);
            if (h)
                return h;
        }
    }
    for (size_t i = 0; i < sizeof(std_dirs) / sizeof(std_dirs[0]); i++) {
        for (int n = 0; n < nnames; n++) {
            snprintf(path, sizeof(path), "%s/%s", std_dirs[i], names[n]);
            if (access(path, R_OK) != 0)
                continue;
            void *h = try_open(path, RTLD_NOW | RTLD_LOCAL, probe);
            if (h)
                return h;
        }
    }
    return NULL;
}

static int is_self(void *h, const char *probe)
{
    void *p = vc_real_dlsym(h, probe);
    return p && base_of(p) == self_base();
}

static int same_object(void *h, const char *path, const char *probe)
{
    void *other = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!other)
        return 0;
    int same = vc_real_dlsym(other, probe) == vc_real_dlsym(h, probe);
    dlclose(other);
    return same;
}

static void *open_real(const char *explicit_path, const char *env_name, const char *soname, const char *stem,
                       const char *probe)
{
    /* Open the soname first. Under LD_PRELOAD that is the process's own driver:
     * the shim must call the very library the application uses. When this shim
     * is installed under that name, the loader answers with the shim itself,
     * and the name stays ours: a later dlopen(soname) by the application cannot
     * reach the real library we then open by its path (same soname). */
    void *named = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    int named_self = named && is_self(named, probe);
    if (named && !named_self && !vc_real_dlsym(named, probe)) {
        dlclose(named);
        named = NULL;
    }
    if (named && !named_self) {
        if (explicit_path[0] && !same_object(named, explicit_path, probe))
            VC_WARN("%s=%s is not the %s this process loads; using the process's own so that the shim and the "
                    "application share one driver",
                    env_name, explicit_path, soname);
        return named;
    }
    if (explicit_path[0]) {
        void *h = try_open(explicit_path, RTLD_NOW | RTLD_LOCAL, probe);
        if (!h) {
            const char *e = dlerror();
            VC_ERROR("%s=%s cannot be used as the real library (%s)", env_name, explicit_path,
                     same_file_as_self(explicit_path) ? "it is this shim" : (e ? e : "no such library"));
        }
        return h;
    }
    return search(stem, probe);
}

static void load_cuda(void)
{
    const struct vc_settings *s = vc_settings();
    cuda_handle = open_real(s->real_cuda, "VCUDA_REAL_CUDA", "libcuda.so.1", "libcuda.so", "cuInit");
    if (!cuda_handle) {
        VC_ERROR("cannot find the real CUDA driver (libcuda.so.1); set VCUDA_REAL_CUDA to its path");
        cuda_ok = -1;
        return;
    }
#define RESOLVE(name, base, ver, ptsz) vc_real[VC_H_##name] = vc_real_dlsym(cuda_handle, #name);
    VC_CUDA_HOOKS(RESOLVE)
#undef RESOLVE
#define RESOLVE_I(name) vc_real_internal[VC_I_##name] = vc_real_dlsym(cuda_handle, #name);
    VC_CUDA_INTERNAL(RESOLVE_I)
#undef RESOLVE_I
    cuda_base = base_of(vc_real[VC_H_cuInit]);
    __atomic_store_n(&cuda_ok, 0, __ATOMIC_RELEASE);
    VC_DEBUG("real CUDA driver loaded");
}

static void load_nvml(void)
{
    const struct vc_settings *s = vc_settings();
    nvml_handle = open_real(s->real_nvml, "VCUDA_REAL_NVML", "libnvidia-ml.so.1", "libnvidia-ml.so", "nvmlInit_v2");
    if (!nvml_handle) {
        VC_WARN("cannot find the real NVML (libnvidia-ml.so.1); set VCUDA_REAL_NVML to its path");
        nvml_ok = -1;
        return;
    }
#define RESOLVE(name, base, ver, ptsz) vc_real[VC_H_##name] = vc_real_dlsym(nvml_handle, #name);
    VC_NVML_HOOKS(RESOLVE)
#undef RESOLVE
#define RESOLVE_I(name) vc_real_internal[VC_I_##name] = vc_real_dlsym(nvml_handle, #name);
    VC_NVML_INTERNAL(RESOLVE_I)
#undef RESOLVE_I
    nvml_base = base_of(vc_real_internal[VC_I_nvmlInit_v2]);
    __atomic_store_n(&nvml_ok, 0, __ATOMIC_RELEASE);
    VC_DEBUG("real NVML loaded");
}

int vc_loader_cuda(void)
{
    pthread_once(&cuda_once, load_cuda);
    return __atomic_load_n(&cuda_ok, __ATOMIC_ACQUIRE);
}

int vc_loader_nvml(void)
{
    pthread_once(&nvml_once, load_nvml);
    return __atomic_load_n(&nvml_ok, __ATOMIC_ACQUIRE);
}

int vc_addr_in_real(const void *addr)
{
    void *b = base_of(addr);
    return b && (b == cuda_base || b == nvml_base);
}

void *vc_real_cuda_sym(const char *name)
{
    return cuda_handle ? vc_real_dlsym(cuda_handle, name) : NULL;
}

void *vc_real_nvml_sym(const char *name)
{
    return nvml_handle ? vc_real_dlsym(nvml_handle, name) : NULL;
}
