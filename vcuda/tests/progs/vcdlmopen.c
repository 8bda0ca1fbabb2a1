/* vcdlmopen: a program that opens libcuda.so.1 (or the file given) in a new
 * link-map namespace (dlmopen(LM_ID_NEWLM)), where a preloaded library does
 * not reach, and asks for 2 GiB. Prints ALLOC <rc> (the limits give 1 GiB).
 *   vcdlmopen [LIBRARY] */
#include "testlib.h"

typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*get_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*setcur_t)(CUcontext);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *h = dlmopen(LM_ID_NEWLM, argc > 1 ? argv[1] : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FAIL dlmopen: %s\n", dlerror());
        return 1;
    }
    init_t init = (init_t)dlsym(h, "cuInit");
    get_t get = (get_t)dlsym(h, "cuDeviceGet");
    retain_t retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    setcur_t setcur = (setcur_t)dlsym(h, "cuCtxSetCurrent");
    alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    if (!init || !get || !retain || !setcur || !alloc) {
        printf("FAIL a driver function is missing\n");
        return 1;
    }
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    if (init(0) != CUDA_SUCCESS || get(&d, 0) != CUDA_SUCCESS || retain(&c, d) != CUDA_SUCCESS ||
        setcur(c) != CUDA_SUCCESS) {
        printf("INIT failed\n");
        return 0;
    }
    printf("ALLOC %d\n", alloc(&p, 2048 * MiB));
    return 0;
}
