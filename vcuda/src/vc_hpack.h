/* HPACK (RFC 7541) header block decoder: static and dynamic tables, integer
 * and string literals, Huffman-coded strings. Enough to read the response
 * headers and trailers of one gRPC call. */
#ifndef VC_HPACK_H
#define VC_HPACK_H

#include <stddef.h>
#include <stdint.h>

#define VC_HPACK_MAX_ENTRIES 128

struct vc_hpack_entry {
    char *name;
    char *value;
    size_t size; /* name + value + 32, as RFC 7541 counts it */
};

struct vc_hpack {
    struct vc_hpack_entry ent[VC_HPACK_MAX_ENTRIES]; /* ring, newest at head */
    int head, count;
    size_t size, max_size, limit;
};

typedef void (*vc_hpack_cb)(void *ctx, const char *name, const char *value);

void vc_hpack_init(struct vc_hpack *h, size_t table_size);
void vc_hpack_free(struct vc_hpack *h);
/* Decode one complete header block; calls cb per field. 0 ok, -1 malformed. */
int vc_hpack_decode(struct vc_hpack *h, const uint8_t *buf, size_t len, vc_hpack_cb cb, void *ctx);
/* Huffman-decode into out (NUL-terminated). Returns length or -1. */
int vc_huffman_decode(const uint8_t *in, size_t len, char *out, size_t outcap);

#endif
