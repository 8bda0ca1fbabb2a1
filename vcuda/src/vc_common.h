/* Shared definitions for libvcuda: export/visibility macros and limits. */
#ifndef VC_COMMON_H
#define VC_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "vc_cuda.h"
#include "vc_nvml.h"

#define VC_EXPORT __attribute__((visibility("default")))
#define VC_LIKELY(x) __builtin_expect(!!(x), 1)
#define VC_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Devices one container can have limits for; the last slot of the shared
 * state collects devices the limits do not name (see vc_devices.c). */
#define VC_MAX_DEV 16
#define VC_UNMATCHED (VC_MAX_DEV - 1)
#define VC_MAX_LIMIT_DEV (VC_MAX_DEV - 1)
/* A memory cap meaning "no cap" (a limits entry of 0 bytes: a whole card).
 * A cap of 0 means no memory at all (a device the limits do not name). */
#define VC_NO_CAP UINT64_MAX

/* Newest CUDA version whose cuGetProcAddress version table the shim knows. */
#define VC_KNOWN_CUDA_VERSION 13000

#endif
