/* cuGetProcAddress and cuGetProcAddress_v2: since CUDA 11.3 the runtime gets
 * every driver entry point through them, by base name, CUDA version and
 * default-stream flag. The real driver chooses the ABI variant; the shim then
 * hands back its own wrapper for exactly that variant (matched by the real
 * function's address), and the real pointer for everything it does not hook. */
#define _GNU_SOURCE
#include <string.h>

#include "vc_hooks.h"
#include "vc_loader.h"
#include "vc_log.h"
#include "vc_pfn.h"
#include "vc_state.h"

const struct vc_hook vc_hook_table[VC_HOOK_COUNT] = {
#define ROW(name, base, ver, ptsz) {#name, #base, ver, ptsz, 0, (void *)name},
    VC_CUDA_HOOKS(ROW)
#undef ROW
#define ROW(name, base, ver, ptsz) {#name, #base, ver, ptsz, 1, (void *)name},
    VC_NVML_HOOKS(ROW)
#undef ROW
};

const struct vc_hook *vc_hook_by_name(const char *name)
{
    for (int i = 0; i < VC_HOOK_COUNT; i++)
        if (strcmp(vc_hook_table[i].name, name) == 0)
            return &vc_hook_table[i];
    return NULL;
}

/* The variant a driver would choose from our table (newest version not above
 * cudaVersion, the per-thread one if asked for and present); -1 if none. */
static int choose_variant(const char *base, int ver, cuuint64_t flags)
{
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1, best_ptsz = -1;
    for (int i = 0; i < VC_HOOK_CUDA_END; i++) {
        const struct vc_hook *h = &vc_hook_table[i];
        if (strcmp(h->base, base) != 0 || h->version > ver)
            continue;
        int *slot = h->ptsz ? &best_ptsz : &best;
        if (*slot < 0 || vc_hook_table[*slot].version <= h->version)
            *slot = i;
    }
    return (want_ptsz && best_ptsz >= 0) ? best_ptsz : best;
}

static void *wrap(const char *symbol, void *real_fn, int ver, cuuint64_t flags)
{
    if (!real_fn || !symbol)
        return real_fn;
    /* 1. The driver's choice is one of the functions we hook: our wrapper for it. */
    for (int i = 0; i < VC_HOOK_CUDA_END; i++)
        if (vc_real[i] == real_fn)
            return vc_hook_table[i].wrapper;
    int known_base = 0;
    for (int i = 0; i < VC_HOOK_CUDA_END && !known_base; i++)
        known_base = strcmp(vc_hook_table[i].base, symbol) == 0;
    if (!known_base)
        return real_fn; /* not hooked: the real driver function */
    /* 2. A hooked name, but the driver returned an address it does not export:
     *    choose by our version table, within the CUDA versions we know. */
    if (ver <= VC_KNOWN_CUDA_VERSION) {
        int v = choose_variant(symbol, ver, flags);
        if (v >= 0) {
            void *expected = NULL;
            if (!__atomic_compare_exchange_n(&vc_real[v], &expected, real_fn, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE) &&
                expected != real_fn)
                VC_DEBUG("cuGetProcAddress(%s, %d): driver address differs from the exported %s; using the latter",
                         symbol, ver, vc_hook_table[v].name);
            return vc_hook_table[v].wrapper;
        }
    }
    /* 3. A variant newer than this shim: do not guess its ABI. */
    VC_WARN("cuGetProcAddress(%s, cudaVersion %d, flags %llu) returned a variant this shim does not know; "
            "calls through it are not limited",
            symbol, ver, (unsigned long long)flags);
    return real_fn;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    if (vc_loader_cuda() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r;
    if (REAL(cuGetProcAddress))
        r = REAL(cuGetProcAddress)(symbol, pfn, ver, flags);
    else if (REAL(cuGetProcAddress_v2))
        r = REAL(cuGetProcAddress_v2)(symbol, pfn, ver, flags, NULL);
    else
        return CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && pfn)
        *pfn = wrap(symbol, *pfn, ver, flags);
    return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (vc_loader_cuda() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!REAL(cuGetProcAddress_v2)) {
        /* A driver older than CUDA 12: answer through the 11.x entry point. */
        if (!REAL(cuGetProcAddress))
            return CUDA_ERROR_NOT_FOUND;
        CUresult r = REAL(cuGetProcAddress)(symbol, pfn, ver, flags);
        if (status)
            *status = r == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (r == CUDA_SUCCESS && pfn)
            *pfn = wrap(symbol, *pfn, ver, flags);
        return r;
    }
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = wrap(symbol, *pfn, ver, flags);
    return r;
}
