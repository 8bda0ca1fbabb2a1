/* Registration with the pod's vDevice server (gpumgr.vdevice.v1.VDevice/Register). */
#ifndef VC_REGISTER_H
#define VC_REGISTER_H

#include <stddef.h>
#include <stdint.h>

#include "vc_limits.h"

struct vc_register_req {
    const char *container_id; /* "" when unknown */
    int pid;
};

/* Encode a RegisterRequest. Returns the length, or 0 if it does not fit. */
size_t vc_register_encode(const struct vc_register_req *req, uint8_t *out, size_t cap);
/* Decode a RegisterResponse into limits. 0 ok, -1 malformed (reason in err). */
int vc_register_decode(const uint8_t *msg, size_t len, struct vc_limits *out, char *err, size_t errlen);

/* Call the server. 0: limits filled from the answer. -1: no usable answer
 * (transport failure or a gRPC error status), reason in err. -2: the server
 * is busy (RESOURCE_EXHAUSTED or UNAVAILABLE): worth asking again. */
int vc_register(const char *socket_path, int timeout_ms, const struct vc_register_req *req, struct vc_limits *out,
                char *err, size_t errlen);

/* vc_register, asked again with backoff (20 ms doubling to 320 ms, with
 * jitter) while the server is busy, all within timeout_ms. */
int vc_register_retrying(const char *socket_path, int timeout_ms, const struct vc_register_req *req,
                         struct vc_limits *out, char *err, size_t errlen);

/* Best-effort container id from /proc/self/cgroup, "" if it cannot tell. */
void vc_container_id(char *out, size_t cap);

#endif
