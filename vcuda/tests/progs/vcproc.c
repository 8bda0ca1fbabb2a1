/* vcproc: entry-point resolution as the CUDA runtimes do it. The runtime
 * dlopens libcuda.so.1, finds cuGetProcAddress (11.3+) or cuGetProcAddress_v2
 * (12.0+) with dlsym and gets every other function through it by base name,
 * CUDA version and default-stream flag. Environment: VCTEST_SHIM = path of the
 * shim file in use, VCTEST_FAKE = path of the (fake) real driver.
 * Limits expected: 8 GiB on device 0 of a 16 GiB card. */
#include <limits.h>

#include "testlib.h"

typedef CUresult (*gpa4_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa5_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc2_t)(CUdeviceptr *, size_t);
typedef CUresult (*alloc1_t)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*asyncalloc_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*graphlaunch_t)(CUgraphExec, CUstream);
typedef CUresult (*apiver_t)(CUcontext, unsigned int *);
typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*memgetinfo_t)(size_t *, size_t *);

#define GiB (1024ull * MiB)

static char shim_path[PATH_MAX], fake_path[PATH_MAX];

static int in_file(void *p, const char *want)
{
    Dl_info i;
    char got[PATH_MAX];
    if (!p || !dladdr(p, &i) || !i.dli_fname || !realpath(i.dli_fname, got))
        return 0;
    return strcmp(got, want) == 0;
}

static const char *where(void *p)
{
    Dl_info i;
    if (!p)
        return "NULL";
    return dladdr(p, &i) && i.dli_fname ? i.dli_fname : "?";
}

static unsigned long long used_via(memgetinfo_t f)
{
    size_t fr, t;
    f(&fr, &t);
    return t - fr;
}

static unsigned long long counters(int which)
{
    unsigned long long c[5];
    fakegpu_counters(&c[0], &c[1], &c[2], &c[3], &c[4]);
    return c[which];
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!realpath(getenv("VCTEST_SHIM"), shim_path) || !realpath(getenv("VCTEST_FAKE"), fake_path)) {
        printf("FAIL set VCTEST_SHIM and VCTEST_FAKE\n");
        return 1;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL, "dlopen libcuda.so.1: %s", dlerror());
    if (!h)
        return 1;

    /* ---- the CUDA 11.3 runtime: cuGetProcAddress (4 arguments) ---- */
    gpa4_t gpa = (gpa4_t)dlsym(h, "cuGetProcAddress");
    EXPECT(in_file((void *)gpa, shim_path), "dlsym(libcuda, cuGetProcAddress) is in %s", where((void *)gpa));
    void *p = NULL;
    EXPECT_RC(gpa("cuInit", &p, 11030, 0), CUDA_SUCCESS);
    EXPECT(in_file(p, shim_path), "cuInit resolved to %s", where(p));
    EXPECT_RC(((init_t)p)(0), CUDA_SUCCESS);
    t_setup(0);
    memgetinfo_t info = NULL;
    EXPECT_RC(gpa("cuMemGetInfo", (void **)&info, 11030, 0), CUDA_SUCCESS);
    EXPECT(in_file((void *)info, shim_path), "cuMemGetInfo resolved to %s", where((void *)info));
    size_t fr = 0, tot = 0;
    info(&fr, &tot);
    EXPECT(tot == 8 * GiB, "cuMemGetInfo total %zu, want the 8 GiB limit (the _v2 ABI)", tot);

    alloc2_t a2 = NULL;
    EXPECT_RC(gpa("cuMemAlloc", (void **)&a2, 11030, 0), CUDA_SUCCESS);
    EXPECT(in_file((void *)a2, shim_path), "cuMemAlloc@11030 resolved to %s", where((void *)a2));
    unsigned long long base = used_via(info);
    CUdeviceptr d;
    EXPECT_RC(a2(&d, 5 * GiB), CUDA_SUCCESS); /* size_t size: only the _v2 ABI can count 5 GiB */
    EXPECT(used_via(info) == base + 5 * GiB, "cuMemAlloc@11030 counted %llu, want 5 GiB (the _v2 wrapper)",
           used_via(info) - base);
    EXPECT_RC(a2(&d, 4 * GiB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFree_v2(d), CUDA_SUCCESS);
    printf("PASS 11.3: cuMemAlloc -> the _v2 wrapper\n");

    alloc1_t a1 = NULL;
    EXPECT_RC(gpa("cuMemAlloc", (void **)&a1, 3010, 0), CUDA_SUCCESS);
    EXPECT(in_file((void *)a1, shim_path), "cuMemAlloc@3010 resolved to %s", where((void *)a1));
    base = used_via(info);
    CUdeviceptr_v1 d1;
    EXPECT_RC(a1(&d1, 3 * MiB), CUDA_SUCCESS);
    EXPECT(used_via(info) == base + 3 * MiB, "legacy cuMemAlloc counted %llu", used_via(info) - base);
    printf("PASS 3.1 ABI: cuMemAlloc -> the legacy wrapper\n");

    launch_t lk = NULL;
    EXPECT_RC(gpa("cuLaunchKernel", (void **)&lk, 11030, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
              CUDA_SUCCESS);
    EXPECT(in_file((void *)lk, shim_path), "cuLaunchKernel(PTDS) resolved to %s", where((void *)lk));
    CUmodule mod;
    CUfunction fn;
    cuModuleLoadData(&mod, "fake");
    cuModuleGetFunction(&fn, mod, "k");
    unsigned long long ptsz0 = counters(1), legacy0 = counters(0);
    EXPECT_RC(lk(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    EXPECT(counters(1) == ptsz0 + 1 && counters(0) == legacy0,
           "the PTDS lookup did not reach cuLaunchKernel_ptsz (ptsz %llu legacy %llu)", counters(1) - ptsz0,
           counters(0) - legacy0);
    EXPECT_RC(gpa("cuLaunchKernel", (void **)&lk, 11030, 0), CUDA_SUCCESS);
    EXPECT(in_file((void *)lk, shim_path), "cuLaunchKernel resolved to %s", where((void *)lk));
    EXPECT_RC(lk(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    EXPECT(counters(0) == legacy0 + 1, "the default lookup did not reach cuLaunchKernel");
    printf("PASS 11.3: cuLaunchKernel with and without the per-thread flag\n");

    gpa4_t self4 = NULL;
    EXPECT_RC(gpa("cuGetProcAddress", (void **)&self4, 11030, 0), CUDA_SUCCESS);
    EXPECT(self4 == gpa, "cuGetProcAddress@11030 is not the shim's 4-argument wrapper (%s)", where((void *)self4));
    EXPECT_RC(gpa("cuNoSuchFunction", &p, 11030, 0), CUDA_ERROR_NOT_FOUND);
    apiver_t av = NULL;
    EXPECT_RC(gpa("cuCtxGetApiVersion", (void **)&av, 11030, 0), CUDA_SUCCESS);
    EXPECT(in_file((void *)av, fake_path), "unhooked cuCtxGetApiVersion resolved to %s, not the driver",
           where((void *)av));
    printf("PASS 11.3: self lookup, unknown names, unhooked names\n");

    /* ---- the CUDA 12.x runtime: cuGetProcAddress_v2 ---- */
    gpa5_t gpa2 = (gpa5_t)dlsym(h, "cuGetProcAddress_v2");
    EXPECT(in_file((void *)gpa2, shim_path), "dlsym(cuGetProcAddress_v2) is in %s", where((void *)gpa2));
    CUdriverProcAddressQueryResult st = 99;
    gpa5_t self5 = NULL;
    EXPECT_RC(gpa2("cuGetProcAddress", (void **)&self5, 12040, 0, &st), CUDA_SUCCESS);
    EXPECT(self5 == gpa2 && st == CU_GET_PROC_ADDRESS_SUCCESS,
           "cuGetProcAddress@12040 is not the shim's _v2 wrapper (%s, status %d)", where((void *)self5), st);
    EXPECT_RC(gpa("cuGetProcAddress", (void **)&self5, 12000, 0), CUDA_SUCCESS);
    EXPECT(self5 == gpa2, "the 4-argument lookup of cuGetProcAddress@12000 did not return the _v2 wrapper");
    st = 99;
    EXPECT_RC(self5("cuMemAlloc", (void **)&a2, 12040, 0, &st), CUDA_SUCCESS);
    EXPECT(st == CU_GET_PROC_ADDRESS_SUCCESS && in_file((void *)a2, shim_path), "cuMemAlloc@12040: %s status %d",
           where((void *)a2), st);
    base = used_via(info);
    EXPECT_RC(a2(&d, 5 * GiB), CUDA_SUCCESS);
    EXPECT(used_via(info) == base + 5 * GiB, "cuMemAlloc@12040 counted %llu", used_via(info) - base);
    EXPECT_RC(cuMemFree_v2(d), CUDA_SUCCESS);
    st = 99;
    EXPECT_RC(gpa2("cuNoSuchFunction", &p, 12040, 0, &st), CUDA_SUCCESS);
    EXPECT(p == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown name: %p status %d", p, st);
    st = 99;
    EXPECT_RC(gpa2("cuMemAllocAsync", &p, 11000, 0, &st), CUDA_SUCCESS);
    EXPECT(p == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "too old a version: %p status %d", p, st);
    EXPECT_RC(gpa2("cuMemAlloc", &p, 99000, 0, &st), CUDA_ERROR_INVALID_VALUE); /* newer than the driver */
    st = 99;
    EXPECT_RC(gpa2("cuCtxGetApiVersion", (void **)&av, 12040, 0, &st), CUDA_SUCCESS);
    EXPECT(in_file((void *)av, fake_path) && st == CU_GET_PROC_ADDRESS_SUCCESS, "unhooked: %s status %d",
           where((void *)av), st);
    unsigned int apiv = 0;
    EXPECT_RC(av(NULL, &apiv), CUDA_SUCCESS);
    printf("PASS 12.x: cuGetProcAddress_v2, symbolStatus, self lookup\n");

    /* ---- the CUDA 13 runtime ---- */
    asyncalloc_t aa = NULL;
    st = 99;
    EXPECT_RC(gpa2("cuMemAllocAsync", (void **)&aa, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
              CUDA_SUCCESS);
    EXPECT(in_file((void *)aa, shim_path), "cuMemAllocAsync(PTDS)@13000 resolved to %s", where((void *)aa));
    ptsz0 = counters(1);
    base = used_via(info);
    EXPECT_RC(aa(&d, 64 * MiB, NULL), CUDA_SUCCESS);
    EXPECT(counters(1) == ptsz0 + 1, "cuMemAllocAsync(PTDS) did not reach the _ptsz variant");
    EXPECT(used_via(info) == base + 64 * MiB, "cuMemAllocAsync_ptsz counted %llu", used_via(info) - base);
    EXPECT_RC(aa(&d, 8 * GiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    graphlaunch_t gl = NULL;
    EXPECT_RC(gpa2("cuGraphLaunch", (void **)&gl, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
              CUDA_SUCCESS);
    EXPECT(in_file((void *)gl, shim_path), "cuGraphLaunch(PTDS)@13000 resolved to %s", where((void *)gl));
    EXPECT_RC(gpa2("cuLaunchKernelEx", &p, 13000, 0, &st), CUDA_SUCCESS);
    EXPECT(in_file(p, shim_path), "cuLaunchKernelEx@13000 resolved to %s", where(p));
    EXPECT_RC(gpa2("cuLaunchKernel", (void **)&lk, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
              CUDA_SUCCESS);
    ptsz0 = counters(1);
    EXPECT(in_file((void *)lk, shim_path), "cuLaunchKernel(PTDS)@13000 resolved to %s", where((void *)lk));
    EXPECT_RC(lk(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    EXPECT(counters(1) == ptsz0 + 1, "cuLaunchKernel(PTDS)@13000 did not reach the _ptsz variant");
    EXPECT_RC(gpa2("cuMemGetInfo", (void **)&info, 13000, 0, &st), CUDA_SUCCESS);
    EXPECT(in_file((void *)info, shim_path), "cuMemGetInfo@13000 resolved to %s", where((void *)info));
    printf("PASS 13.0: per-thread variants and the rest\n");

    /* Direct lookups through dlsym also give the wrappers. */
    p = dlsym(h, "cuMemAlloc_v2");
    EXPECT(in_file(p, shim_path), "dlsym(cuMemAlloc_v2) is in %s", where(p));
    /* Unhooked names: the driver's own function (preloaded), or the shim's
     * pass-through entry point when the shim is installed as libcuda.so.1. */
    p = dlsym(h, "cuCtxGetApiVersion");
    int dropin = getenv("VCTEST_DROPIN") != NULL;
    EXPECT(in_file(p, dropin ? shim_path : fake_path), "dlsym(cuCtxGetApiVersion) is in %s", where(p));
    apiv = 0;
    EXPECT_RC(((apiver_t)p)(NULL, &apiv), CUDA_SUCCESS);
    EXPECT(apiv == 3020, "cuCtxGetApiVersion through dlsym answered %u", apiv);
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    p = nv ? dlsym(nv, "nvmlDeviceGetMemoryInfo_v2") : NULL;
    EXPECT(in_file(p, shim_path), "dlsym(libnvidia-ml, nvmlDeviceGetMemoryInfo_v2) is in %s", where(p));
    printf("PASS dlsym on the driver handles\n");
    return t_failures ? 1 : 0;
}
