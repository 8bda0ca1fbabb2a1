/* The container's limits, from the vDevice server or the limits file. */
#ifndef VC_LIMITS_H
#define VC_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "vc_common.h"

struct vc_dev_limit {
    char uuid[96];          /* "GPU-..." or "" when the source gave none */
    int index;              /* host NVML index, informational, -1 unknown */
    uint64_t memory_limit;  /* bytes, 0 = no cap */
};

struct vc_limits {
    int version;
    char pod_uid[128];
    char container_name[256];
    int core_limit;   /* percent of one card, 0 = no compute limit */
    int hard_limit;   /* 1 hard, 0 soft */
    int core_ceiling; /* soft mode upper bound, 0 = 100 */
    int device_count;
    struct vc_dev_limit dev[VC_MAX_LIMIT_DEV];
    int host_pid;     /* from registration, 0 = unknown */
    char source[VC_MAX_LIMIT_DEV * 8 + 512]; /* where they came from, for logs */
};

/* Parse the limits file at `path`. Returns 0, or -1 with a message naming
 * the file (and line) in err. Never crashes on any input. */
int vc_limits_parse_file(const char *path, struct vc_limits *out, char *err, size_t errlen);

/* Parse limits text (exposed for tests through the file parser). */
int vc_limits_parse_text(const char *path, const char *text, size_t len, struct vc_limits *out, char *err,
                         size_t errlen);

#endif
