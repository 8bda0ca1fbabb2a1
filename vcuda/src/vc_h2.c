#define _GNU_SOURCE
#include "vc_h2.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "vc_hpack.h"

enum { F_DATA = 0, F_HEADERS = 1, F_RST = 3, F_SETTINGS = 4, F_PUSH = 5, F_PING = 6, F_GOAWAY = 7, F_WINDOW = 8,
       F_CONT = 9 };
enum { FL_END_STREAM = 0x1, FL_ACK = 0x1, FL_END_HEADERS = 0x4, FL_PADDED = 0x8, FL_PRIORITY = 0x20 };

#define MAX_FRAME (1u << 20)
#define MAX_MESSAGE (64u * 1024u)

struct conn {
    int fd;
    uint64_t deadline;
    char *err;
    size_t errlen;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int wait_fd(struct conn *c, short ev)
{
    for (;;) {
        uint64_t t = now_ms();
        if (t >= c->deadline) {
            snprintf(c->err, c->errlen, "timed out");
            return -1;
        }
        struct pollfd p = {.fd = c->fd, .events = ev};
        int r = poll(&p, 1, (int)(c->deadline - t));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR) {
            snprintf(c->err, c->errlen, "poll: %s", strerror(errno));
            return -1;
        }
    }
}

static int send_all(struct conn *c, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(c, POLLOUT) != 0)
                return -1;
            continue;
        }
        snprintf(c->err, c->errlen, "send: %s", w < 0 ? strerror(errno) : "closed");
        return -1;
    }
    return 0;
}

static int recv_all(struct conn *c, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t r = recv(c->fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) {
            snprintf(c->err, c->errlen, "connection closed by the server");
            return -1;
        }
        if (errno == EAGAIN || errno == EINTR) {
            if (wait_fd(c, POLLIN) != 0)
                return -1;
            continue;
        }
        snprintf(c->err, c->errlen, "recv: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static void frame_header(uint8_t *h, size_t len, int type, int flags, uint32_t stream)
{
    h[0] = (uint8_t)(len >> 16);
    h[1] = (uint8_t)(len >> 8);
    h[2] = (uint8_t)len;
    h[3] = (uint8_t)type;
    h[4] = (uint8_t)flags;
    h[5] = (uint8_t)(stream >> 24);
    h[6] = (uint8_t)(stream >> 16);
    h[7] = (uint8_t)(stream >> 8);
    h[8] = (uint8_t)stream;
}

static int send_frame(struct conn *c, int type, int flags, uint32_t stream, const uint8_t *payload, size_t len)
{
    uint8_t h[9];
    frame_header(h, len, type, flags, stream);
    if (send_all(c, h, 9) != 0)
        return -1;
    return len ? send_all(c, payload, len) : 0;
}

/* HPACK: literal header field without indexing, new name, no Huffman. */
static size_t put_int(uint8_t *out, uint8_t first, int prefix, size_t v)
{
    size_t max = (1u << prefix) - 1u, n = 0;
    if (v < max) {
        out[n++] = (uint8_t)(first | v);
        return n;
    }
    out[n++] = (uint8_t)(first | max);
    v -= max;
    while (v >= 128) {
        out[n++] = (uint8_t)(0x80 | (v & 0x7f));
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static size_t put_literal(uint8_t *out, int name_index, const char *name, const char *value)
{
    size_t n = put_int(out, 0x00, 4, (size_t)name_index);
    if (name_index == 0) {
        size_t l = strlen(name);
        n += put_int(out + n, 0x00, 7, l);
        memcpy(out + n, name, l);
        n += l;
    }
    size_t l = strlen(value);
    n += put_int(out + n, 0x00, 7, l);
    memcpy(out + n, value, l);
    return n + l;
}

struct hdr_ctx {
    struct vc_h2_result *res;
};

static void on_header(void *ctx, const char *name, const char *value)
{
    struct vc_h2_result *res = ((struct hdr_ctx *)ctx)->res;
    if (strcmp(name, ":status") == 0)
        res->http_status = atoi(value);
    else if (strcmp(name, "grpc-status") == 0)
        res->grpc_status = atoi(value);
    else if (strcmp(name, "grpc-message") == 0)
        snprintf(res->grpc_message, sizeof(res->grpc_message), "%s", value);
}

static int connect_unix(struct conn *c, const char *path)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(a.sun_path)) {
        snprintf(c->err, c->errlen, "socket path too long");
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path));
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        snprintf(c->err, c->errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            snprintf(c->err, c->errlen, "%s", strerror(errno));
            return -1;
        }
        if (wait_fd(c, POLLOUT) != 0)
            return -1;
        int so = 0;
        socklen_t sl = sizeof(so);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 || so != 0) {
            snprintf(c->err, c->errlen, "%s", strerror(so ? so : errno));
            return -1;
        }
    }
    return 0;
}

int vc_h2_unary(const char *socket_path, const char *method_path, const uint8_t *msg, size_t len, int timeout_ms,
                struct vc_h2_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    res->grpc_status = -1;
    struct conn c = {.fd = -1, .deadline = now_ms() + (uint64_t)timeout_ms, .err = err, .errlen = errlen};
    struct vc_hpack hp;
    vc_hpack_init(&hp, 4096);
    uint8_t *frame = NULL, *block = NULL;
    size_t block_len = 0;
    int block_end_stream = 0, in_headers = 0, done = 0, rc = -1;

    if (connect_unix(&c, socket_path) != 0)
        goto out;

    /* Preface, our SETTINGS (no push), request headers, request message. */
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    if (send_all(&c, (const uint8_t *)preface, sizeof(preface) - 1) != 0)
        goto out;
    static const uint8_t settings[] = {0x00, 0x02, 0x00, 0x00, 0x00, 0x00};
    if (send_frame(&c, F_SETTINGS, 0, 0, settings, sizeof(settings)) != 0)
        goto out;
    uint8_t hb[1024];
    size_t hn = 0;
    hb[hn++] = 0x83; /* :method POST */
    hb[hn++] = 0x86; /* :scheme http */
    if (strlen(method_path) > 400) {
        snprintf(err, errlen, "method path too long");
        goto out;
    }
    hn += put_literal(hb + hn, 4, NULL, method_path);               /* :path */
    hn += put_literal(hb + hn, 1, NULL, "localhost");               /* :authority */
    hn += put_literal(hb + hn, 31, NULL, "application/grpc");       /* content-type */
    hn += put_literal(hb + hn, 0, "te", "trailers");
    hn += put_literal(hb + hn, 0, "grpc-timeout", "3S");
    hn += put_literal(hb + hn, 58, NULL, "libvcuda/1");             /* user-agent */
    if (send_frame(&c, F_HEADERS, FL_END_HEADERS, 1, hb, hn) != 0)
        goto out;
    uint8_t *data = malloc(len + 5);
    if (!data) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    data[0] = 0;
    data[1] = (uint8_t)(len >> 24);
    data[2] = (uint8_t)(len >> 16);
    data[3] = (uint8_t)(len >> 8);
    data[4] = (uint8_t)len;
    if (len)
        memcpy(data + 5, msg, len);
    int sr = send_frame(&c, F_DATA, FL_END_STREAM, 1, data, len + 5);
    free(data);
    if (sr != 0)
        goto out;

    uint8_t *body = NULL;
    size_t body_len = 0;
    struct hdr_ctx hc = {res};
    while (!done) {
        uint8_t h[9];
        if (recv_all(&c, h, 9) != 0)
            goto out_body;
        size_t flen = ((size_t)h[0] << 16) | ((size_t)h[1] << 8) | h[2];
        int type = h[3], flags = h[4];
        uint32_t stream = (((uint32_t)h[5] << 24) | ((uint32_t)h[6] << 16) | ((uint32_t)h[7] << 8) | h[8]) &
                          0x7fffffffu;
        if (flen > MAX_FRAME) {
            snprintf(err, errlen, "frame of %zu bytes is too large", flen);
            goto out_body;
        }
        free(frame);
        frame = malloc(flen ? flen : 1);
        if (!frame || recv_all(&c, frame, flen) != 0) {
            if (!frame)
                snprintf(err, errlen, "out of memory");
            goto out_body;
        }
        if (in_headers && type != F_CONT) {
            snprintf(err, errlen, "expected CONTINUATION, got frame type %d", type);
            goto out_body;
        }
        const uint8_t *p = frame;
        size_t plen = flen;
        if ((type == F_DATA || type == F_HEADERS) && (flags & FL_PADDED)) {
            if (plen < 1 || p[0] >= plen) {
                snprintf(err, errlen, "bad padding");
                goto out_body;
            }
            plen -= 1u + p[0];
            p += 1;
        }
        switch (type) {
        case F_SETTINGS:
            if (!(flags & FL_ACK) && send_frame(&c, F_SETTINGS, FL_ACK, 0, NULL, 0) != 0)
                goto out_body;
            break;
        case F_PING:
            if (!(flags & FL_ACK) && send_frame(&c, F_PING, FL_ACK, 0, frame, flen) != 0)
                goto out_body;
            break;
        case F_GOAWAY:
            if (!done) {
                unsigned code = flen >= 8 ? ((unsigned)frame[4] << 24 | (unsigned)frame[5] << 16 |
                                             (unsigned)frame[6] << 8 | frame[7])
                                          : 0;
                snprintf(err, errlen, "server sent GOAWAY (error code %u)", code);
                goto out_body;
            }
            break;
        case F_RST:
            if (stream == 1) {
                unsigned code = flen >= 4 ? ((unsigned)frame[0] << 24 | (unsigned)frame[1] << 16 |
                                             (unsigned)frame[2] << 8 | frame[3])
                                          : 0;
                snprintf(err, errlen, "server reset the stream (error code %u)", code);
                goto out_body;
            }
            break;
        case F_PUSH:
            snprintf(err, errlen, "unexpected PUSH_PROMISE");
            goto out_body;
        case F_HEADERS:
        case F_CONT:
            if (type == F_HEADERS) {
                if (flags & FL_PRIORITY) {
                    if (plen < 5) {
                        snprintf(err, errlen, "bad HEADERS frame");
                        goto out_body;
                    }
                    p += 5;
                    plen -= 5;
                }
                block_len = 0;
                block_end_stream = flags & FL_END_STREAM;
            }
            {
                uint8_t *nb = realloc(block, block_len + plen + 1);
                if (!nb) {
                    snprintf(err, errlen, "out of memory");
                    goto out_body;
                }
                block = nb;
                memcpy(block + block_len, p, plen);
                block_len += plen;
            }
            in_headers = !(flags & FL_END_HEADERS);
            if (!in_headers) {
                if (vc_hpack_decode(&hp, block, block_len, on_header, &hc) != 0) {
                    snprintf(err, errlen, "malformed header block");
                    goto out_body;
                }
                if (stream == 1 && block_end_stream)
                    done = 1;
            }
            break;
        case F_DATA:
            if (stream == 1) {
                if (body_len + plen > MAX_MESSAGE + 5) {
                    snprintf(err, errlen, "response larger than %u bytes", MAX_MESSAGE);
                    goto out_body;
                }
                uint8_t *nb = realloc(body, body_len + plen + 1);
                if (!nb) {
                    snprintf(err, errlen, "out of memory");
                    goto out_body;
                }
                body = nb;
                memcpy(body + body_len, p, plen);
                body_len += plen;
                if (flags & FL_END_STREAM)
                    done = 1;
            }
            break;
        default:
            break; /* WINDOW_UPDATE, PRIORITY, unknown: ignore */
        }
    }
    if (res->http_status != 200) {
        snprintf(err, errlen, "HTTP status %d", res->http_status);
        goto out_body;
    }
    if (body_len > 0) {
        if (body_len < 5 || body[0] != 0) {
            snprintf(err, errlen, "bad gRPC message framing");
            goto out_body;
        }
        size_t mlen = ((size_t)body[1] << 24) | ((size_t)body[2] << 16) | ((size_t)body[3] << 8) | body[4];
        if (mlen != body_len - 5) {
            snprintf(err, errlen, "gRPC message length %zu does not match %zu bytes received", mlen, body_len - 5);
            goto out_body;
        }
        memmove(body, body + 5, mlen);
        res->message = body;
        res->message_len = mlen;
        body = NULL;
    }
    rc = 0;
out_body:
    free(body);
out:
    free(frame);
    free(block);
    vc_hpack_free(&hp);
    if (c.fd >= 0)
        close(c.fd);
    return rc;
}

void vc_h2_result_free(struct vc_h2_result *res)
{
    free(res->message);
    res->message = NULL;
}
