/* vcnext: dlsym(RTLD_NEXT, ...) still resolves relative to its real caller
 * when libvcuda's dlsym sits in front (run with
 * LD_PRELOAD="libvcuda.so libnext_probe.so"). */
#include "testlib.h"

int main(void)
{
    int (*f)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "abs");
    int *calls = (int *)dlsym(RTLD_DEFAULT, "next_probe_calls");
    if (!f || !calls) {
        printf("FAIL libnext_probe.so is not preloaded\n");
        return 1;
    }
    int r = f(-5);
    printf("abs(-5)=%d probe_calls=%d\n", r, *calls);
    return (r == 5 && *calls == 1) ? 0 : 1;
}
