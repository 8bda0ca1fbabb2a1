#define _GNU_SOURCE
#include "vc_status.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vc_log.h"
#include "vc_register.h"
#include "vc_state.h"

const char *vc_measure_name(unsigned mode)
{
    switch (mode) {
    case VC_MEASURE_PROCESS:
        return "process";
    case VC_MEASURE_DEVICE:
        return "device";
    case VC_MEASURE_GPM:
        return "gpm";
    default:
        return "unthrottled";
    }
}

void vc_status_write(struct vc_shm *shm)
{
    const char *base = vc_shm_path();
    size_t n = strlen(base);
    if (n < 4 || strcmp(base + n - 4, ".shm") != 0)
        return; /* a private region: nobody else would read it */
    char path[1300], tmp[1400];
    snprintf(path, sizeof(path), "%.*s.status", (int)(n - 4), base);
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    char id[80];
    vc_container_id(id, sizeof(id));
    char buf[4096];
    int len = snprintf(buf, sizeof(buf), "version=1\ncontainer_id=%s\n", id);
    int seen[VC_MAX_DEV] = {0};
    for (int d = 0; d < vc.ndev && len > 0 && (size_t)len < sizeof(buf); d++) {
        int s = vc.slot_of[d];
        if (s < 0 || s >= VC_MAX_DEV || seen[s])
            continue;
        seen[s] = 1;
        unsigned mode = atomic_load(&shm->thr[s].mode);
        len += snprintf(buf + len, sizeof(buf) - (size_t)len, "device%d_uuid=%s\ndevice%d_compute=%s\n", s,
                        vc.uuid[d], s, vc_measure_name(mode));
    }
    if (len <= 0 || (size_t)len >= sizeof(buf))
        return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        VC_DEBUG("cannot write %s", tmp);
        return;
    }
    ssize_t w = write(fd, buf, (size_t)len);
    close(fd);
    if (w != len || rename(tmp, path) != 0) {
        unlink(tmp);
        VC_DEBUG("cannot write %s", path);
    }
}
