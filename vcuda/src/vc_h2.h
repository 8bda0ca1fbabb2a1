/* A minimal gRPC client: one unary call over HTTP/2 with prior knowledge on a
 * unix socket, no library. */
#ifndef VC_H2_H
#define VC_H2_H

#include <stddef.h>
#include <stdint.h>

struct vc_h2_result {
    int http_status;        /* :status, 0 if none */
    int grpc_status;        /* grpc-status, -1 if none */
    char grpc_message[256];
    uint8_t *message;       /* the response message (malloc'd), without the 5-byte prefix */
    size_t message_len;
};

/* Returns 0 when a complete response (with trailers) arrived; -1 on any
 * transport or protocol failure, with a reason in err. */
int vc_h2_unary(const char *socket_path, const char *method_path, const uint8_t *msg, size_t len, int timeout_ms,
                struct vc_h2_result *res, char *err, size_t errlen);
void vc_h2_result_free(struct vc_h2_result *res);

#endif
