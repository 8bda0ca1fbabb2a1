#define _GNU_SOURCE
#include "vc_register.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vc_h2.h"

#define METHOD "/gpumgr.vdevice.v1.VDevice/Register"

static size_t put_varint(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

size_t vc_register_encode(const struct vc_register_req *req, uint8_t *out, size_t cap)
{
    size_t n = 0;
    size_t idlen = req->container_id ? strlen(req->container_id) : 0;
    if (idlen + 32 > cap)
        return 0;
    if (idlen) {
        out[n++] = (3 << 3) | 2; /* container_id = 3, length-delimited */
        n += put_varint(out + n, idlen);
        memcpy(out + n, req->container_id, idlen);
        n += idlen;
    }
    if (req->pid) {
        out[n++] = (4 << 3) | 0; /* pid = 4, varint (int32: negative as 10 bytes) */
        n += put_varint(out + n, (uint64_t)(int64_t)req->pid);
    }
    return n;
}

struct reader {
    const uint8_t *p, *end;
};

static int get_varint(struct reader *r, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end)
            return -1;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

static int skip(struct reader *r, int wire)
{
    uint64_t v;
    switch (wire) {
    case 0:
        return get_varint(r, &v);
    case 1:
        if (r->end - r->p < 8)
            return -1;
        r->p += 8;
        return 0;
    case 2:
        if (get_varint(r, &v) != 0 || v > (uint64_t)(r->end - r->p))
            return -1;
        r->p += v;
        return 0;
    case 5:
        if (r->end - r->p < 4)
            return -1;
        r->p += 4;
        return 0;
    default:
        return -1; /* groups are not used by proto3 */
    }
}

static int decode_device(const uint8_t *p, size_t len, struct vc_dev_limit *d)
{
    struct reader r = {p, p + len};
    memset(d, 0, sizeof(*d));
    d->index = -1;
    while (r.p < r.end) {
        uint64_t key, v;
        if (get_varint(&r, &key) != 0)
            return -1;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 2) {
            if (get_varint(&r, &v) != 0 || v > (uint64_t)(r.end - r.p) || v >= sizeof(d->uuid))
                return -1;
            memcpy(d->uuid, r.p, v);
            d->uuid[v] = 0;
            r.p += v;
        } else if (field == 2 && wire == 0) {
            if (get_varint(&r, &v) != 0)
                return -1;
            d->index = (int)(int32_t)v;
        } else if (field == 3 && wire == 0) {
            if (get_varint(&r, &v) != 0)
                return -1;
            d->memory_limit = v;
        } else if (skip(&r, wire) != 0) {
            return -1;
        }
    }
    return 0;
}

int vc_register_decode(const uint8_t *msg, size_t len, struct vc_limits *out, char *err, size_t errlen)
{
    struct vc_limits l;
    memset(&l, 0, sizeof(l));
    l.version = 1;
    struct reader r = {msg, msg + len};
    while (r.p < r.end) {
        uint64_t key, v;
        if (get_varint(&r, &key) != 0)
            goto bad;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 2) {
            if (get_varint(&r, &v) != 0 || v > (uint64_t)(r.end - r.p))
                goto bad;
            if (l.device_count >= VC_MAX_LIMIT_DEV) {
                snprintf(err, errlen, "response names more than %d devices", VC_MAX_LIMIT_DEV);
                return -1;
            }
            if (decode_device(r.p, (size_t)v, &l.dev[l.device_count]) != 0)
                goto bad;
            l.device_count++;
            r.p += v;
        } else if ((field == 2 || field == 3 || field == 4 || field == 5) && wire == 0) {
            if (get_varint(&r, &v) != 0)
                goto bad;
            int32_t x = (int32_t)v;
            if (field == 2)
                l.core_limit = x < 0 ? 0 : x;
            else if (field == 3)
                l.hard_limit = v != 0;
            else if (field == 4)
                l.core_ceiling = x < 0 ? 0 : (x > 100 ? 100 : x);
            else
                l.host_pid = x < 0 ? 0 : x;
        } else if (skip(&r, wire) != 0) {
            goto bad;
        }
    }
    *out = l;
    return 0;
bad:
    snprintf(err, errlen, "malformed RegisterResponse");
    return -1;
}

int vc_register(const char *socket_path, int timeout_ms, const struct vc_register_req *req, struct vc_limits *out,
                char *err, size_t errlen)
{
    uint8_t msg[512];
    size_t n = vc_register_encode(req, msg, sizeof(msg));
    struct vc_h2_result res;
    char why[256] = "";
    if (vc_h2_unary(socket_path, METHOD, msg, n, timeout_ms, &res, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "cannot reach %s (%s)", socket_path, why);
        vc_h2_result_free(&res);
        return -1;
    }
    if (res.grpc_status != 0) {
        if (res.grpc_status < 0)
            snprintf(err, errlen, "%s: response without grpc-status", socket_path);
        else
            snprintf(err, errlen, "%s refused registration: gRPC status %d: %s", socket_path, res.grpc_status,
                     res.grpc_message);
        int busy = res.grpc_status == 8 || res.grpc_status == 14; /* RESOURCE_EXHAUSTED, UNAVAILABLE */
        vc_h2_result_free(&res);
        return busy ? -2 : -1;
    }
    int rc = vc_register_decode(res.message ? res.message : (const uint8_t *)"", res.message_len, out, why,
                                sizeof(why));
    vc_h2_result_free(&res);
    if (rc != 0) {
        snprintf(err, errlen, "%s: %s", socket_path, why);
        return -1;
    }
    snprintf(out->source, sizeof(out->source), "vDevice server %s", socket_path);
    return 0;
}

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int vc_register_retrying(const char *socket_path, int timeout_ms, const struct vc_register_req *req,
                         struct vc_limits *out, char *err, size_t errlen)
{
    long long deadline = mono_ms() + timeout_ms;
    unsigned seed = (unsigned)getpid() * 2654435761u;
    int backoff = 20;
    for (int attempt = 1;; attempt++) {
        long long left = deadline - mono_ms();
        int rc = vc_register(socket_path, left > 1 ? (int)left : 1, req, out, err, errlen);
        if (rc != -2)
            return rc == 0 ? 0 : -1;
        seed = seed * 1103515245u + 12345u;
        int wait = backoff / 2 + (int)(seed >> 16) % (backoff / 2 + 1); /* spread out ranks that start together */
        if (mono_ms() + wait >= deadline) {
            size_t n = strlen(err);
            snprintf(err + n, errlen - n, " (asked %d times in %d ms)", attempt, timeout_ms);
            return -1;
        }
        struct timespec ts = {wait / 1000, (long)(wait % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        backoff = backoff < 320 ? backoff * 2 : 320;
    }
}

/* The last run of exactly 64 hex digits in s (container ids in cgroup paths:
 * docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope, /docker/<id>). */
static int last_hex64(const char *s, char *out, size_t cap)
{
    int found = 0;
    for (const char *p = s; *p;) {
        if (!isxdigit((unsigned char)*p)) {
            p++;
            continue;
        }
        const char *q = p;
        while (isxdigit((unsigned char)*q))
            q++;
        if (q - p == 64 && cap > 64) {
            memcpy(out, p, 64);
            out[64] = 0;
            found = 1;
        }
        p = q;
    }
    return found;
}

void vc_container_id(char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        char *path = strchr(line, ':');
        if (path)
            path = strchr(path + 1, ':');
        if (path && last_hex64(path + 1, out, cap))
            break;
    }
    fclose(f);
}
