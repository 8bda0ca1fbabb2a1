/* Process-wide shim state: limits, the container's shared region, and the
 * map from this process's CUDA devices to the container's device slots. */
#ifndef VC_STATE_H
#define VC_STATE_H

#include <stdatomic.h>

#include "vc_common.h"
#include "vc_limits.h"
#include "vc_shm.h"

enum vc_phase {
    VC_PHASE_NEW = 0,      /* nothing done yet */
    VC_PHASE_LIMITS = 1,   /* limits loaded; devices not mapped yet */
    VC_PHASE_READY = 2,    /* devices mapped: accounting and throttling active */
    VC_PHASE_CLOSED = -1,  /* no limits: CUDA refused (fail closed) */
    VC_PHASE_NODRIVER = -2 /* the real driver cannot be found */
};

/* What a hook does after vc_enter(). Non-negative values are CUresults to return. */
#define VC_GO (-1)
#define VC_PASS (-2)

struct vc_state {
    _Atomic int phase;
    struct vc_limits limits;
    struct vc_shm *shm;
    int host_pid;
    char fail_reason[1024];
    int ndev;                     /* CUDA devices this process sees */
    int slot_of[VC_MAX_DEV];      /* CUdevice -> container device slot */
    int single_slot;              /* the slot when the process sees one device, else -1 */
    uint64_t mem_limit[VC_MAX_DEV]; /* per slot: bytes, VC_NO_CAP, 0 = none at all */
    uint64_t pitch_align[VC_MAX_DEV]; /* per CUdevice */
    nvmlDevice_t nvml[VC_MAX_DEV];  /* per slot, NULL if unknown */
    uint32_t nvml_mask;             /* bit s: nvml[s] is known (this process can measure slot s) */
    char uuid[VC_MAX_DEV][96];      /* per CUdevice */
};

extern struct vc_state vc;
/* Bumped by every reservation change of this process (see vc_throttle_overhead() in vc_throttle.c). */
extern _Atomic uint64_t vc_mem_gen;

int vc_enter_slow(void);

/* Make sure the shim is ready. Returns VC_GO, VC_PASS or a CUresult. */
static inline int vc_enter(void)
{
    if (VC_LIKELY(atomic_load_explicit(&vc.phase, memory_order_acquire) == VC_PHASE_READY))
        return VC_GO;
    return vc_enter_slow();
}

/* Load limits (once). Returns the phase reached. */
int vc_process_init(void);
/* Map devices after the real cuInit succeeded. */
void vc_devices_init(void);
/* Container slot of a CUdevice (VC_UNMATCHED for devices the limits do not name). */
static inline int vc_slot_of(CUdevice d)
{
    return (d >= 0 && d < vc.ndev) ? vc.slot_of[d] : VC_UNMATCHED;
}
/* Container slot of a device by UUID, by the same rule as CUDA's devices
 * (VC_UNMATCHED when no entry is its). */
int vc_slot_for_uuid(const char *uuid);
/* Memory cap of a slot: bytes, VC_NO_CAP, or 0 for VC_UNMATCHED. */
uint64_t vc_cap_of_slot(int s);
/* Slot of the calling thread's current context, -1 if there is none. */
int vc_current_slot(void);
/* Print the fail-closed line (once per process). */
void vc_report_closed(void);

#endif
