#define _GNU_SOURCE
#include "vc_settings.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vc_log.h"

static struct vc_settings settings;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void copy_env(char *dst, size_t n, const char *name, const char *fallback)
{
    const char *v = getenv(name);
    if (!v || !*v)
        v = fallback;
    if (strlen(v) >= n) {
        VC_WARN("%s is longer than %zu bytes; using %s", name, n - 1, fallback);
        v = fallback;
    }
    snprintf(dst, n, "%s", v);
}

static void load(void)
{
    const char *lvl = getenv("VCUDA_LOG_LEVEL");
    settings.log_level = VC_LOG_WARN;
    if (lvl && *lvl) {
        char *end = NULL;
        long v = strtol(lvl, &end, 10);
        if (end && *end == 0 && v >= 0 && v <= 4)
            settings.log_level = (int)v;
    }
    vc_log_set_level(settings.log_level);
    if (lvl && *lvl && settings.log_level == VC_LOG_WARN && strcmp(lvl, "2") != 0)
        VC_WARN("VCUDA_LOG_LEVEL=%s is not 0..4; using 2", lvl);
    copy_env(settings.socket_path, sizeof(settings.socket_path), "VCUDA_SOCKET", "/etc/vcuda/vcuda.sock");
    copy_env(settings.limits_path, sizeof(settings.limits_path), "VCUDA_LIMITS", "/etc/vcuda/limits");
    copy_env(settings.real_cuda, sizeof(settings.real_cuda), "VCUDA_REAL_CUDA", "");
    copy_env(settings.real_nvml, sizeof(settings.real_nvml), "VCUDA_REAL_NVML", "");
    copy_env(settings.shared_dir, sizeof(settings.shared_dir), "VCUDA_SHARED_DIR", "/dev/shm");
    copy_env(settings.ld_library_path, sizeof(settings.ld_library_path), "LD_LIBRARY_PATH", "");
}

const struct vc_settings *vc_settings(void)
{
    pthread_once(&once, load);
    return &settings;
}
