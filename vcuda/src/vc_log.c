#define _GNU_SOURCE
#include "vc_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static int level = VC_LOG_WARN;

void vc_log_set_level(int l)
{
    level = l < VC_LOG_SILENT ? VC_LOG_SILENT : (l > VC_LOG_DEBUG ? VC_LOG_DEBUG : l);
}

int vc_log_enabled(int l)
{
    return l <= level;
}

void vc_log(int l, const char *fmt, ...)
{
    static const char *names[] = {"", "error", "warning", "info", "debug"};
    if (l > level || l <= VC_LOG_SILENT)
        return;
    int saved = errno;
    char buf[1024];
    int n = snprintf(buf, sizeof(buf), "vcuda[%d] %s: ", (int)getpid(), names[l]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(buf))
        n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(buf) - 1)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    /* One write per line so lines from several processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
    errno = saved;
}
