#define _GNU_SOURCE
#include "vc_hpack.h"

#include <stdlib.h>
#include <string.h>

/* RFC 7541 Appendix A */
static const char *const STATIC_TABLE[62][2] = {
    {"", ""},
    {":authority", ""},
    {":method", "GET"},
    {":method", "POST"},
    {":path", "/"},
    {":path", "/index.html"},
    {":scheme", "http"},
    {":scheme", "https"},
    {":status", "200"},
    {":status", "204"},
    {":status", "206"},
    {":status", "304"},
    {":status", "400"},
    {":status", "404"},
    {":status", "500"},
    {"accept-charset", ""},
    {"accept-encoding", "gzip, deflate"},
    {"accept-language", ""},
    {"accept-ranges", ""},
    {"accept", ""},
    {"access-control-allow-origin", ""},
    {"age", ""},
    {"allow", ""},
    {"authorization", ""},
    {"cache-control", ""},
    {"content-disposition", ""},
    {"content-encoding", ""},
    {"content-language", ""},
    {"content-length", ""},
    {"content-location", ""},
    {"content-range", ""},
    {"content-type", ""},
    {"cookie", ""},
    {"date", ""},
    {"etag", ""},
    {"expect", ""},
    {"expires", ""},
    {"from", ""},
    {"host", ""},
    {"if-match", ""},
    {"if-modified-since", ""},
    {"if-none-match", ""},
    {"if-range", ""},
    {"if-unmodified-since", ""},
    {"last-modified", ""},
    {"link", ""},
    {"location", ""},
    {"max-forwards", ""},
    {"proxy-authenticate", ""},
    {"proxy-authorization", ""},
    {"range", ""},
    {"referer", ""},
    {"refresh", ""},
    {"retry-after", ""},
    {"server", ""},
    {"set-cookie", ""},
    {"strict-transport-security", ""},
    {"transfer-encoding", ""},
    {"user-agent", ""},
    {"vary", ""},
    {"via", ""},
    {"www-authenticate", ""},
};

/* RFC 7541 Appendix B: code (right-aligned) and bit length per symbol; 256 = EOS. */
static const uint32_t HUFF_CODE[257] = {
    0x1ff8, 0x7fffd8, 0xfffffe2, 0xfffffe3, 0xfffffe4, 0xfffffe5, 0xfffffe6, 0xfffffe7,
    0xfffffe8, 0xffffea, 0x3ffffffc, 0xfffffe9, 0xfffffea, 0x3ffffffd, 0xfffffeb, 0xfffffec,
    0xfffffed, 0xfffffee, 0xfffffef, 0xffffff0, 0xffffff1, 0xffffff2, 0x3ffffffe, 0xffffff3,
    0xffffff4, 0xffffff5, 0xffffff6, 0xffffff7, 0xffffff8, 0xffffff9, 0xffffffa, 0xffffffb,
    0x14, 0x3f8, 0x3f9, 0xffa, 0x1ff9, 0x15, 0xf8, 0x7fa,
    0x3fa, 0x3fb, 0xf9, 0x7fb, 0xfa, 0x16, 0x17, 0x18,
    0x0, 0x1, 0x2, 0x19, 0x1a, 0x1b, 0x1c, 0x1d,
    0x1e, 0x1f, 0x5c, 0xfb, 0x7ffc, 0x20, 0xffb, 0x3fc,
    0x1ffa, 0x21, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62,
    0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a,
    0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72,
    0xfc, 0x73, 0xfd, 0x1ffb, 0x7fff0, 0x1ffc, 0x3ffc, 0x22,
    0x7ffd, 0x3, 0x23, 0x4, 0x24, 0x5, 0x25, 0x26,
    0x27, 0x6, 0x74, 0x75, 0x28, 0x29, 0x2a, 0x7,
    0x2b, 0x76, 0x2c, 0x8, 0x9, 0x2d, 0x77, 0x78,
    0x79, 0x7a, 0x7b, 0x7ffe, 0x7fc, 0x3ffd, 0x1ffd, 0xffffffc,
    0xfffe6, 0x3fffd2, 0xfffe7, 0xfffe8, 0x3fffd3, 0x3fffd4, 0x3fffd5, 0x7fffd9,
    0x3fffd6, 0x7fffda, 0x7fffdb, 0x7fffdc, 0x7fffdd, 0x7fffde, 0xffffeb, 0x7fffdf,
    0xffffec, 0xffffed, 0x3fffd7, 0x7fffe0, 0xffffee, 0x7fffe1, 0x7fffe2, 0x7fffe3,
    0x7fffe4, 0x1fffdc, 0x3fffd8, 0x7fffe5, 0x3fffd9, 0x7fffe6, 0x7fffe7, 0xffffef,
    0x3fffda, 0x1fffdd, 0xfffe9, 0x3fffdb, 0x3fffdc, 0x7fffe8, 0x7fffe9, 0x1fffde,
    0x7fffea, 0x3fffdd, 0x3fffde, 0xfffff0, 0x1fffdf, 0x3fffdf, 0x7fffeb, 0x7fffec,
    0x1fffe0, 0x1fffe1, 0x3fffe0, 0x1fffe2, 0x7fffed, 0x3fffe1, 0x7fffee, 0x7fffef,
    0xfffea, 0x3fffe2, 0x3fffe3, 0x3fffe4, 0x7ffff0, 0x3fffe5, 0x3fffe6, 0x7ffff1,
    0x3ffffe0, 0x3ffffe1, 0xfffeb, 0x7fff1, 0x3fffe7, 0x7ffff2, 0x3fffe8, 0x1ffffec,
    0x3ffffe2, 0x3ffffe3, 0x3ffffe4, 0x7ffffde, 0x7ffffdf, 0x3ffffe5, 0xfffff1, 0x1ffffed,
    0x7fff2, 0x1fffe3, 0x3ffffe6, 0x7ffffe0, 0x7ffffe1, 0x3ffffe7, 0x7ffffe2, 0xfffff2,
    0x1fffe4, 0x1fffe5, 0x3ffffe8, 0x3ffffe9, 0xffffffd, 0x7ffffe3, 0x7ffffe4, 0x7ffffe5,
    0xfffec, 0xfffff3, 0xfffed, 0x1fffe6, 0x3fffe9, 0x1fffe7, 0x1fffe8, 0x7ffff3,
    0x3fffea, 0x3fffeb, 0x1ffffee, 0x1ffffef, 0xfffff4, 0xfffff5, 0x3ffffea, 0x7ffff4,
    0x3ffffeb, 0x7ffffe6, 0x3ffffec, 0x3ffffed, 0x7ffffe7, 0x7ffffe8, 0x7ffffe9, 0x7ffffea,
    0x7ffffeb, 0xffffffe, 0x7ffffec, 0x7ffffed, 0x7ffffee, 0x7ffffef, 0x7fffff0, 0x3ffffee,
    0x3fffffff,
};

static const uint8_t HUFF_LEN[257] = {
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
};

int vc_huffman_decode(const uint8_t *in, size_t len, char *out, size_t outcap)
{
    uint32_t code = 0;
    int bits = 0;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        for (int b = 7; b >= 0; b--) {
            code = (code << 1) | ((in[i] >> b) & 1u);
            bits++;
            if (bits > 30)
                return -1;
            if (bits < 5)
                continue;
            for (int s = 0; s < 257; s++) {
                if (HUFF_LEN[s] == bits && HUFF_CODE[s] == code) {
                    if (s == 256)
                        return -1; /* EOS must not appear in a string */
                    if (n + 1 >= outcap)
                        return -1;
                    out[n++] = (char)s;
                    code = 0;
                    bits = 0;
                    break;
                }
            }
        }
    }
    /* Padding: fewer than 8 bits, all ones (a prefix of EOS). */
    if (bits >= 8 || code != (1u << bits) - 1u)
        return -1;
    out[n] = 0;
    return (int)n;
}

void vc_hpack_init(struct vc_hpack *h, size_t table_size)
{
    memset(h, 0, sizeof(*h));
    h->max_size = table_size;
    h->limit = table_size;
}

static void evict_one(struct vc_hpack *h)
{
    int oldest = (h->head + h->count - 1) % VC_HPACK_MAX_ENTRIES;
    h->size -= h->ent[oldest].size;
    free(h->ent[oldest].name);
    free(h->ent[oldest].value);
    h->ent[oldest].name = h->ent[oldest].value = NULL;
    h->count--;
}

void vc_hpack_free(struct vc_hpack *h)
{
    while (h->count > 0)
        evict_one(h);
}

static void table_add(struct vc_hpack *h, const char *name, const char *value)
{
    size_t sz = strlen(name) + strlen(value) + 32;
    while (h->count > 0 && (h->size + sz > h->max_size || h->count == VC_HPACK_MAX_ENTRIES))
        evict_one(h);
    if (sz > h->max_size)
        return; /* an entry larger than the table empties it and is not added */
    h->head = (h->head + VC_HPACK_MAX_ENTRIES - 1) % VC_HPACK_MAX_ENTRIES;
    h->ent[h->head].name = strdup(name);
    h->ent[h->head].value = strdup(value);
    if (!h->ent[h->head].name || !h->ent[h->head].value) {
        free(h->ent[h->head].name);
        free(h->ent[h->head].value);
        h->head = (h->head + 1) % VC_HPACK_MAX_ENTRIES;
        return;
    }
    h->ent[h->head].size = sz;
    h->size += sz;
    h->count++;
}

static int lookup(struct vc_hpack *h, uint64_t idx, const char **name, const char **value)
{
    if (idx == 0)
        return -1;
    if (idx <= 61) {
        *name = STATIC_TABLE[idx][0];
        *value = STATIC_TABLE[idx][1];
        return 0;
    }
    uint64_t d = idx - 62;
    if (d >= (uint64_t)h->count)
        return -1;
    int slot = (h->head + (int)d) % VC_HPACK_MAX_ENTRIES;
    *name = h->ent[slot].name;
    *value = h->ent[slot].value;
    return 0;
}

static int read_int(const uint8_t *buf, size_t len, size_t *pos, int prefix, uint64_t *out)
{
    if (*pos >= len)
        return -1;
    uint64_t max = (1u << prefix) - 1u;
    uint64_t v = buf[(*pos)++] & max;
    if (v < max) {
        *out = v;
        return 0;
    }
    int shift = 0;
    for (;;) {
        if (*pos >= len || shift > 28)
            return -1;
        uint8_t b = buf[(*pos)++];
        v += (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80))
            break;
    }
    *out = v;
    return 0;
}

static int read_string(const uint8_t *buf, size_t len, size_t *pos, char *out, size_t outcap)
{
    if (*pos >= len)
        return -1;
    int huff = (buf[*pos] & 0x80) != 0;
    uint64_t n;
    if (read_int(buf, len, pos, 7, &n) != 0 || n > len - *pos)
        return -1;
    if (huff) {
        if (vc_huffman_decode(buf + *pos, (size_t)n, out, outcap) < 0)
            return -1;
    } else {
        if (n + 1 > outcap)
            return -1;
        memcpy(out, buf + *pos, (size_t)n);
        out[n] = 0;
    }
    *pos += (size_t)n;
    return 0;
}

int vc_hpack_decode(struct vc_hpack *h, const uint8_t *buf, size_t len, vc_hpack_cb cb, void *ctx)
{
    size_t pos = 0;
    char name[256], value[4096];
    while (pos < len) {
        uint8_t b = buf[pos];
        uint64_t idx;
        const char *n, *v;
        if (b & 0x80) { /* indexed field */
            if (read_int(buf, len, &pos, 7, &idx) != 0 || lookup(h, idx, &n, &v) != 0)
                return -1;
            cb(ctx, n, v);
            continue;
        }
        if ((b & 0xe0) == 0x20) { /* dynamic table size update */
            if (read_int(buf, len, &pos, 5, &idx) != 0 || idx > h->limit)
                return -1;
            h->max_size = (size_t)idx;
            while (h->count > 0 && h->size > h->max_size)
                evict_one(h);
            continue;
        }
        int incremental = (b & 0xc0) == 0x40;
        int prefix = incremental ? 6 : 4;
        if (read_int(buf, len, &pos, prefix, &idx) != 0)
            return -1;
        if (idx == 0) {
            if (read_string(buf, len, &pos, name, sizeof(name)) != 0)
                return -1;
        } else {
            if (lookup(h, idx, &n, &v) != 0 || strlen(n) >= sizeof(name))
                return -1;
            strcpy(name, n);
        }
        if (read_string(buf, len, &pos, value, sizeof(value)) != 0)
            return -1;
        if (incremental)
            table_add(h, name, value);
        cb(ctx, name, value);
    }
    return 0;
}
