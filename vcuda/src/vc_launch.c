/* Launch hooks: every launch path pays its cost to the compute limiter
 * before reaching the driver. Under the limit this is one atomic
 * subtraction (no system call, no file read, no getenv). */
#define _GNU_SOURCE
#include "vc_hooks.h"
#include "vc_pfn.h"
#include "vc_state.h"
#include "vc_throttle.h"

#define CALL_REAL(name, ...) (REAL(name) ? REAL(name)(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

static inline uint64_t kernel_cost(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz)
{
    uint64_t blocks = (uint64_t)gx * gy * gz;
    uint64_t threads = (uint64_t)bx * by * bz;
    uint64_t c = blocks * (threads ? threads : 1);
    return c ? c : 1;
}

static inline int pay(uint64_t cost)
{
    int e = vc_enter();
    if (VC_UNLIKELY(e != VC_GO))
        return e >= 0 ? e : CUDA_SUCCESS;
    int s = vc.single_slot >= 0 ? vc.single_slot : vc_current_slot();
    vc_throttle_charge(s, cost);
    return CUDA_SUCCESS;
}

static inline int pay_kernel(uint64_t cost)
{
    vc_cost_note(cost);
    return pay(cost);
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shm, CUstream st, void **params, void **extra)
{
    int r = pay_kernel(kernel_cost(gx, gy, gz, bx, by, bz));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shm, st, params, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shm, CUstream st, void **params, void **extra)
{
    int r = pay_kernel(kernel_cost(gx, gy, gz, bx, by, bz));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, st, params, extra);
}

static inline uint64_t config_cost(const CUlaunchConfig *c)
{
    return c ? kernel_cost(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ) : 1;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    int r = pay_kernel(config_cost(c));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchKernelEx, c, f, params, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    int r = pay_kernel(config_cost(c));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchKernelEx_ptsz, c, f, params, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shm, CUstream st, void **params)
{
    int r = pay_kernel(kernel_cost(gx, gy, gz, bx, by, bz));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shm, st, params);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned shm, CUstream st, void **params)
{
    int r = pay_kernel(kernel_cost(gx, gy, gz, bx, by, bz));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, st, params);
}

/* Legacy launches: the block shape was set separately, so only the grid counts. */
CUresult cuLaunch(CUfunction f)
{
    int r = pay_kernel(1);
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunch, f);
}

CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
    int r = pay_kernel(kernel_cost((unsigned)w, (unsigned)h, 1, 1, 1, 1));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchGrid, f, w, h);
}

CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream st)
{
    int r = pay_kernel(kernel_cost((unsigned)w, (unsigned)h, 1, 1, 1, 1));
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuLaunchGridAsync, f, w, h, st);
}

/* A graph's kernels are not visible at launch: it pays the process's average
 * kernel cost, and the controller's feedback absorbs the difference. */
#define GRAPH_COST_DEFAULT 4096 /* before any kernel was seen: 128 blocks of 32 threads */

static inline uint64_t graph_cost(void)
{
    uint64_t a = atomic_load_explicit(&vc_cost_avg, memory_order_relaxed);
    return a ? a : GRAPH_COST_DEFAULT;
}

CUresult cuGraphLaunch(CUgraphExec g, CUstream st)
{
    int r = pay(graph_cost());
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuGraphLaunch, g, st);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream st)
{
    int r = pay(graph_cost());
    if (VC_UNLIKELY(r != CUDA_SUCCESS))
        return r;
    return CALL_REAL(cuGraphLaunch_ptsz, g, st);
}
