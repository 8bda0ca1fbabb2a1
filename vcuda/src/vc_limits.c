#define _GNU_SOURCE
#include "vc_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIMITS_FILE_MAX (64 * 1024)

static int parse_u64(const char *s, uint64_t *out)
{
    if (!*s)
        return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    uint64_t v;
    if (parse_u64(s, &v) != 0 || v < (uint64_t)lo || v > (uint64_t)hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* A '#' at the start of a line or after a space or tab starts a comment
 * that runs to the end of the line. */
static void strip_comment(char *s)
{
    for (char *p = s; *p; p++) {
        if (*p == '#' && (p == s || p[-1] == ' ' || p[-1] == '\t')) {
            *p = 0;
            return;
        }
    }
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = 0;
    return s;
}

/* "device<N>_<field>" -> N and field, or -1. */
static int device_key(const char *key, const char **field)
{
    if (strncmp(key, "device", 6) != 0)
        return -1;
    const char *p = key + 6;
    if (*p < '0' || *p > '9')
        return -1;
    int n = 0;
    while (*p >= '0' && *p <= '9') {
        n = n * 10 + (*p - '0');
        if (n > 1000)
            return -1;
        p++;
    }
    if (*p != '_')
        return -1;
    *field = p + 1;
    return n;
}

int vc_limits_parse_text(const char *path, const char *text, size_t len, struct vc_limits *out, char *err,
                         size_t errlen)
{
    struct vc_limits l;
    memset(&l, 0, sizeof(l));
    l.version = -1;
    l.device_count = -1;
    l.hard_limit = 1;
    int have_mem[VC_MAX_LIMIT_DEV] = {0};
    for (int i = 0; i < VC_MAX_LIMIT_DEV; i++)
        l.dev[i].index = -1;

    size_t pos = 0;
    int lineno = 0;
    char line[1024];
    while (pos < len) {
        lineno++;
        size_t end = pos;
        while (end < len && text[end] != '\n')
            end++;
        size_t n = end - pos;
        if (memchr(text + pos, 0, n)) {
            snprintf(err, errlen, "%s:%d: contains a NUL byte", path, lineno);
            return -1;
        }
        if (n >= sizeof(line)) {
            snprintf(err, errlen, "%s:%d: line longer than %zu bytes", path, lineno, sizeof(line) - 1);
            return -1;
        }
        memcpy(line, text + pos, n);
        line[n] = 0;
        pos = end + 1;
        strip_comment(line);
        char *s = trim(line);
        if (*s == 0)
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected key=value, got '%.60s'", path, lineno, s);
            return -1;
        }
        *eq = 0;
        char *key = trim(s);
        char *val = trim(eq + 1);
        int bad = 0;
        const char *field = NULL;
        int dn;
        if (strcmp(key, "version") == 0) {
            bad = parse_int(val, 0, 1000000, &l.version);
        } else if (strcmp(key, "pod_uid") == 0) {
            bad = strlen(val) >= sizeof(l.pod_uid);
            if (!bad)
                snprintf(l.pod_uid, sizeof(l.pod_uid), "%s", val);
        } else if (strcmp(key, "container_name") == 0) {
            bad = strlen(val) >= sizeof(l.container_name);
            if (!bad)
                snprintf(l.container_name, sizeof(l.container_name), "%s", val);
        } else if (strcmp(key, "core_limit") == 0) {
            bad = parse_int(val, 0, 100000, &l.core_limit);
        } else if (strcmp(key, "hard_limit") == 0) {
            bad = parse_int(val, 0, 1, &l.hard_limit);
        } else if (strcmp(key, "core_ceiling") == 0) {
            bad = parse_int(val, 0, 100, &l.core_ceiling);
        } else if (strcmp(key, "device_count") == 0) {
            bad = parse_int(val, 0, VC_MAX_LIMIT_DEV, &l.device_count);
        } else if ((dn = device_key(key, &field)) >= 0) {
            if (dn < VC_MAX_LIMIT_DEV) {
                struct vc_dev_limit *d = &l.dev[dn];
                if (strcmp(field, "uuid") == 0) {
                    bad = strlen(val) >= sizeof(d->uuid) || strlen(val) == 0;
                    if (!bad)
                        snprintf(d->uuid, sizeof(d->uuid), "%s", val);
                } else if (strcmp(field, "index") == 0) {
                    bad = parse_int(val, 0, 1000000, &d->index);
                } else if (strcmp(field, "memory_limit") == 0) {
                    bad = parse_u64(val, &d->memory_limit);
                    have_mem[dn] = !bad;
                }
            }
        }
        if (bad) {
            snprintf(err, errlen, "%s:%d: bad value for %s: '%.60s'", path, lineno, key, val);
            return -1;
        }
    }
    if (l.version < 0) {
        snprintf(err, errlen, "%s: missing key 'version'", path);
        return -1;
    }
    if (l.version != 1) {
        snprintf(err, errlen, "%s: unsupported version %d (this shim reads version 1)", path, l.version);
        return -1;
    }
    if (l.device_count < 0) {
        snprintf(err, errlen, "%s: missing key 'device_count'", path);
        return -1;
    }
    for (int i = 0; i < l.device_count; i++) {
        if (!have_mem[i]) {
            snprintf(err, errlen, "%s: missing key 'device%d_memory_limit'", path, i);
            return -1;
        }
    }
    for (int i = l.device_count; i < VC_MAX_LIMIT_DEV; i++)
        memset(&l.dev[i], 0, sizeof(l.dev[i]));
    snprintf(l.source, sizeof(l.source), "file %s", path);
    *out = l;
    return 0;
}

int vc_limits_parse_file(const char *path, struct vc_limits *out, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot read %s (%s)", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(LIMITS_FILE_MAX + 1);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "cannot read %s (out of memory)", path);
        return -1;
    }
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, buf + len, LIMITS_FILE_MAX + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "cannot read %s (%s)", path, strerror(errno));
            close(fd);
            free(buf);
            return -1;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len > LIMITS_FILE_MAX) {
            snprintf(err, errlen, "%s: larger than %d bytes", path, LIMITS_FILE_MAX);
            close(fd);
            free(buf);
            return -1;
        }
    }
    close(fd);
    int rc = vc_limits_parse_text(path, buf, len, out, err, errlen);
    free(buf);
    return rc;
}
