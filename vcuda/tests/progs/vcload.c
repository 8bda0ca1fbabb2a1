/* vcload: a compute load that launches as fast as it can.
 *   vcload SECONDS BLOCKS PATH [SYNC_EVERY] [ORDINAL]
 * PATH: kernel | ptsz | ex | coop | graph | getproc (cuGetProcAddress_v2, per-thread)
 * Each kernel has BLOCKS blocks of 32 threads; the fake card runs a block in
 * FAKEGPU_BLOCK_NS. Prints the number of launches. */
#include "testlib.h"

typedef CUresult (*gpa5_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 4)
        return 2;
    double seconds = atof(argv[1]);
    unsigned blocks = (unsigned)atoi(argv[2]);
    const char *path = argv[3];
    int sync_every = argc > 4 ? atoi(argv[4]) : 64;
    int ordinal = argc > 5 ? atoi(argv[5]) : 0;
    printf("PID %d\n", (int)getpid());
    if (t_setup(ordinal) != 0)
        return 1;
    CUmodule mod;
    CUfunction fn;
    cuModuleLoadData(&mod, "fake");
    cuModuleGetFunction(&fn, mod, "k");
    CUgraphExec exec = NULL;
    if (strcmp(path, "graph") == 0) {
        CUgraph g;
        CUgraphNode n;
        CUDA_KERNEL_NODE_PARAMS kp = {fn, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL};
        cuGraphCreate(&g, 0);
        cuGraphAddKernelNode(&n, g, NULL, 0, &kp);
        cuGraphInstantiateWithFlags(&exec, g, 0);
    }
    launch_t via = NULL;
    if (strcmp(path, "getproc") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW);
        gpa5_t gpa = h ? (gpa5_t)dlsym(h, "cuGetProcAddress_v2") : NULL;
        if (!gpa || gpa("cuLaunchKernel", (void **)&via, 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                        NULL) != CUDA_SUCCESS || !via) {
            printf("FAIL no cuLaunchKernel through cuGetProcAddress_v2\n");
            return 1;
        }
    }
    CUlaunchConfig cfg = {blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
    unsigned long long n = 0;
    double end = t_now() + seconds;
    while (t_now() < end) {
        CUresult r;
        if (strcmp(path, "kernel") == 0)
            r = cuLaunchKernel(fn, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        else if (strcmp(path, "ptsz") == 0)
            r = cuLaunchKernel_ptsz(fn, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        else if (strcmp(path, "ex") == 0)
            r = cuLaunchKernelEx(&cfg, fn, NULL, NULL);
        else if (strcmp(path, "coop") == 0)
            r = cuLaunchCooperativeKernel(fn, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL);
        else if (strcmp(path, "graph") == 0)
            r = cuGraphLaunch(exec, NULL);
        else if (via)
            r = via(fn, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        else
            return 2;
        if (r != CUDA_SUCCESS) {
            printf("FAIL launch returned %d\n", r);
            return 1;
        }
        if (++n % (unsigned long long)sync_every == 0)
            cuCtxSynchronize();
    }
    cuCtxSynchronize();
    printf("LAUNCHES %llu\n", n);
    return 0;
}
