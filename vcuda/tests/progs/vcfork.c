/* vcfork: a parent that has used NVML or CUDA forks a worker, as Python
 * multiprocessing, data loaders and serving frameworks do.
 *   vcfork MODE END SECONDS [CTX_BYTES]
 * MODE  nvml:  the parent only asks NVML for the card's memory before forking
 *       init:  the parent initialised CUDA (cuInit and a context)
 *       alloc: the parent also holds 256 MiB
 * END   exit | _exit: how the worker ends (destructors run, or not)
 * The worker initialises CUDA itself. Where the driver lets it (the parent had
 * not initialised CUDA), it allocates 128 MiB and launches 100-block kernels as
 * fast as it can for SECONDS (with CTX_BYTES, it first waits up to 5 s for its
 * context's memory, seen through NVML, to count); where it does not (CUDA does not carry over a
 * fork), it asks NVML what the container uses. The parent then waits for the
 * worker, checks its own slot still counts, says HOLDING and sleeps until
 * killed. Lines: PARENT pid, CHILD pid, CHILD_INIT rc, CHILD_ALLOC rc,
 * CHILD_USED bytes, LAUNCHES n, CHILD_NVML_USED bytes, CHILD_EXIT status,
 * PARENT_USED bytes, PARENT_ALLOC rc, HOLDING. */
#include <sys/wait.h>

#include "testlib.h"

static unsigned long long nvml_used(void)
{
    nvmlDevice_t d;
    nvmlMemory_t m = {0};
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &d) != NVML_SUCCESS ||
        nvmlDeviceGetMemoryInfo(d, &m) != NVML_SUCCESS)
        return ~0ull;
    return m.used;
}

static void load(double seconds)
{
    CUmodule mod;
    CUfunction fn;
    cuModuleLoadData(&mod, "fake");
    cuModuleGetFunction(&fn, mod, "k");
    unsigned long long n = 0;
    double end = t_now() + seconds;
    while (t_now() < end) {
        CUresult r = cuLaunchKernel(fn, 100, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        if (r != CUDA_SUCCESS) {
            printf("FAIL launch returned %d\n", r);
            break;
        }
        if (++n % 64 == 0)
            cuCtxSynchronize();
    }
    cuCtxSynchronize();
    printf("LAUNCHES %llu\n", n);
}

static void worker(double seconds, int use_exit, unsigned long long ctx)
{
    printf("CHILD %d\n", (int)getpid());
    int r = t_setup(0);
    printf("CHILD_INIT %d\n", r);
    if (r == 0) {
        CUdeviceptr p;
        printf("CHILD_ALLOC %d\n", cuMemAlloc_v2(&p, 128 * MiB));
        double until = t_now() + 5;
        while (ctx && t_used() < 128 * MiB + ctx && t_now() < until)
            usleep(50000);
        printf("CHILD_USED %llu\n", t_used());
        if (seconds > 0)
            load(seconds);
    } else {
        printf("CHILD_NVML_USED %llu\n", nvml_used());
    }
    fflush(stdout);
    if (use_exit)
        exit(0);
    _exit(0);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 4)
        return 2;
    const char *mode = argv[1];
    int use_exit = strcmp(argv[2], "exit") == 0;
    double seconds = atof(argv[3]);
    unsigned long long ctx = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    printf("PARENT %d\n", (int)getpid());
    int cuda = strcmp(mode, "nvml") != 0;
    if (!cuda) {
        printf("PARENT_NVML_USED %llu\n", nvml_used());
    } else {
        if (t_setup(0) != 0)
            return 1;
        if (strcmp(mode, "alloc") == 0) {
            CUdeviceptr p;
            EXPECT_RC(cuMemAlloc_v2(&p, 256 * MiB), CUDA_SUCCESS);
        }
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        printf("FAIL fork\n");
        return 1;
    }
    if (child == 0)
        worker(seconds, use_exit, ctx);
    int status = 0;
    waitpid(child, &status, 0);
    printf("CHILD_EXIT %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    if (cuda) {
        printf("PARENT_USED %llu\n", t_used());
        /* The parent's slot is still its own: a new allocation counts exactly. */
        unsigned long long before = t_used();
        CUdeviceptr q;
        CUresult r = cuMemAlloc_v2(&q, 64 * MiB);
        printf("PARENT_ALLOC %d\n", r);
        EXPECT(r != CUDA_SUCCESS || t_used() >= before + 64 * MiB, "the parent's allocation counted %llu",
               t_used() - before);
        if (r == CUDA_SUCCESS)
            cuMemFree_v2(q);
    } else {
        printf("PARENT_USED %llu\n", nvml_used());
    }
    printf("HOLDING\n");
    fflush(stdout);
    sleep(60);
    return 0;
}
