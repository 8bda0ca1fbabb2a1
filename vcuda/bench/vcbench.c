/* vcbench: the cost libvcuda adds to cuMemAlloc_v2 and cuLaunchKernel, measured
 * in one process against calling the (fake) driver directly. Batches of the
 * direct and hooked calls alternate; the figure is the median of the batch
 * means. Run with libvcuda preloaded and a compute limit the load stays under. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vc_cuda.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
void *fakegpu_lookup(const char *);

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);

#define BATCH 1000
#define ROUNDS 61

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp);
    return v[n / 2];
}

static CUdeviceptr ptrs[BATCH];

static double alloc_batch(alloc_t a, free_t f)
{
    double t0 = now_ns();
    for (int i = 0; i < BATCH; i++)
        a(&ptrs[i], 4096);
    double t1 = now_ns();
    for (int i = 0; i < BATCH; i++)
        f(ptrs[i]);
    return (t1 - t0) / BATCH;
}

static double launch_batch(launch_t l, CUfunction fn)
{
    double t0 = now_ns();
    for (int i = 0; i < BATCH; i++)
        l(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    double t1 = now_ns();
    cuCtxSynchronize();
    return (t1 - t0) / BATCH;
}

int main(void)
{
    alloc_t real_alloc = (alloc_t)fakegpu_lookup("cuMemAlloc_v2");
    free_t real_free = (free_t)fakegpu_lookup("cuMemFree_v2");
    launch_t real_launch = (launch_t)fakegpu_lookup("cuLaunchKernel");
    CUdevice d;
    CUcontext c;
    CUmodule m;
    CUfunction fn;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&c, d) != CUDA_SUCCESS || cuCtxSetCurrent(c) != CUDA_SUCCESS ||
        !real_alloc || !real_free || !real_launch) {
        printf("vcbench: setup failed\n");
        return 1;
    }
    cuModuleLoadData(&m, "fake");
    cuModuleGetFunction(&fn, m, "k");

    double da[ROUNDS], ha[ROUNDS], dl[ROUNDS], hl[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        da[r] = alloc_batch(real_alloc, real_free);
        ha[r] = alloc_batch(cuMemAlloc_v2, cuMemFree_v2);
    }
    /* Let the compute limiter learn the load before measuring launches. */
    double until = now_ns() + 6e9;
    while (now_ns() < until)
        launch_batch(cuLaunchKernel, fn);
    for (int r = 0; r < ROUNDS; r++) {
        dl[r] = launch_batch(real_launch, fn);
        hl[r] = launch_batch(cuLaunchKernel, fn);
    }
    double mda = median(da, ROUNDS), mha = median(ha, ROUNDS), mdl = median(dl, ROUNDS), mhl = median(hl, ROUNDS);
    printf("cuMemAlloc_v2   direct %7.1f ns  hooked %7.1f ns  added %7.1f ns  (goal <= 1000 ns)\n", mda, mha,
           mha - mda);
    printf("cuLaunchKernel  direct %7.1f ns  hooked %7.1f ns  added %7.1f ns  (goal <= 100 ns)\n", mdl, mhl,
           mhl - mdl);
    printf("(median of %d alternating batches of %d calls each)\n", ROUNDS, BATCH);
    return 0;
}
