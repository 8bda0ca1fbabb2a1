/* Preloaded after libvcuda by the dlsym test: an ordinary interposer that
 * finds the next definition of a function with dlsym(RTLD_NEXT, ...). If
 * libvcuda's dlsym broke RTLD_NEXT, this would find itself and recurse. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

int next_probe_calls;

int abs(int x)
{
    static int (*next)(int);
    if (!next)
        next = (int (*)(int))dlsym(RTLD_NEXT, "abs");
    next_probe_calls++;
    if (!next || next == abs)
        return -12345; /* RTLD_NEXT resolved to ourselves: broken */
    return next(x);
}
