/* Preloaded in front of libvcuda by the hot-path test: counts getenv calls
 * made while the test program has armed it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

static volatile int armed;
static volatile long count;

void getenv_count_arm(int on)
{
    armed = on;
}

long getenv_count_value(void)
{
    return count;
}

char *getenv(const char *name)
{
    if (armed)
        count++;
    static char *(*real)(const char *);
    if (!real)
        real = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    return real ? real(name) : NULL;
}
