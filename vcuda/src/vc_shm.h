/* The state every process of one container shares: memory in use per device
 * (reserved atomically under a robust process-shared mutex that a dying
 * process cannot leave held), one slot per process (so a dead process's
 * memory is given back), and the compute limiter's token buckets.
 *
 * A slot is alive while its process holds a lock on the slot's byte of the
 * shared file (vc_live.h), whatever PID namespace it is in. */
#ifndef VC_SHM_H
#define VC_SHM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "vc_common.h"

#define VC_SHM_MAGIC 0x44554356u /* "VCUD" */
#define VC_SHM_VERSION 6u
#define VC_MAX_SLOTS 256

struct vc_slot {
    int32_t pid;      /* 0 = free; as the process itself sees it (its PID namespace) */
    int32_t host_pid; /* pid as the host (NVML) sees it, 0 = unknown */
    uint32_t locked;  /* 1: alive while its byte of the file is locked; 0: by pid and start time */
    uint32_t nvml_mask; /* bit d: this process has an NVML handle for device slot d (can measure it) */
    uint64_t start_time;
    uint64_t used[VC_MAX_DEV];
    uint64_t overhead[VC_MAX_DEV]; /* contexts, modules: NVML usage beyond what the shim counted */
};

/* Compute limiter state of one device, shared by the container's processes. */
struct vc_throttle {
    _Alignas(64) _Atomic int64_t tokens;  /* cost units available now */
    _Atomic uint64_t rate;                /* cost units per second; 0 = not started */
    _Atomic uint64_t refill_ns;           /* last refill */
    _Atomic uint64_t ctrl_ns;             /* last controller step */
    _Atomic uint32_t throttled;           /* a launch waited since the last controller step */
    _Atomic uint32_t mode;                /* how utilisation is measured: enum vc_measure */
    _Atomic uint32_t warned;              /* warnings given by the container: 1 not enforced, 2 device measure */
    _Atomic uint32_t ramping;             /* climbing fast: step as soon as NVML has a new sample */
    _Atomic uint32_t none_local;          /* mode NONE only because no process of the container had NVML */
    _Atomic uint32_t blind;               /* steps in a row NVML saw none of our use while we waited and the card was busy */
    _Atomic uint64_t unit_x1e12;          /* device mode: card share per (cost unit/s), x1e12; 0 = unknown */
    _Atomic uint64_t last_new_ns;         /* when NVML last had new per-process samples */
    _Atomic uint64_t sample_gap_ns;       /* how often it has them (smoothed); 0 = not known yet */
    _Atomic uint64_t ctrl_ok_ns;          /* last controller step that had a measurement */
    _Atomic uint64_t dev_util;            /* device mode: last card utilisation read, x1000 */
    _Atomic uint64_t dev_util_ns;         /* device mode: when that reading last changed */
    /* Written only by the process that won the controller step. */
    _Atomic uint64_t last_seen_ts;        /* NVML sample timestamp already consumed */
    _Atomic uint64_t last_sample_ns;      /* when a sample last arrived */
    _Atomic uint64_t other_x1000;         /* smoothed utilisation of other containers, x1000 */
    _Atomic uint64_t own_x1000;           /* last measured own utilisation, x1000 */
    _Atomic uint64_t target_x1000;        /* current target, x1000 */
    _Atomic uint64_t added;               /* tokens ever added (to measure consumption) */
    _Atomic uint64_t ctrl_added;          /* `added` at the last controller step */
    _Atomic int64_t ctrl_tokens;          /* `tokens` at the last controller step */
    /* GPM mode, a MIG instance shared with other containers: what the others
     * use there, measured while the container's launches are held (a probe). */
    _Atomic uint32_t probe;               /* 0 none, 1 launches held (draining), 2 baseline taken, 3 one figure,
                                             VC_PROBE_ENDING its end being written */
    _Atomic uint64_t probe_ns;            /* when the probe began */
    _Atomic uint64_t others_idle;         /* the others' use, x1000: the instance's figure while the container
                                             launched nothing, from the last probe that found it steady */
    _Atomic uint64_t others_idle_ns;      /* when that probe ended, 0 = no such probe (yet) */
    _Atomic uint64_t probe_next_ns;       /* no new probe before this */
    _Atomic uint64_t probe_first;         /* the running probe's first figure, x1000 */
    _Atomic uint64_t probe_pre;           /* the instance's figure at the step that started it, x1000 */
    _Atomic uint64_t probe_pre_rate;      /* what the container spent then, cost units per second */
    _Atomic uint32_t probe_pre_settled;   /* its rate had settled then (a share may be learnt from it) */
    _Atomic uint64_t guess_x1e12;         /* the share per cost unit the last probe suggests (not settled), x1e12 */
    _Atomic uint32_t settled;             /* controller steps in a row that moved the rate by under 12 % */
    _Atomic uint32_t probe_fails;         /* probes in a row that taught nothing (their retry backs off) */
    _Atomic uint64_t pending_x1e12;       /* a share per cost unit a probe found, not yet checked after it, x1e12 */
    _Atomic uint64_t pending_others;      /* the others' figure that probe found, x1000 */
    _Atomic uint32_t pending_steps;       /* figures after the probe seen while that share waits for its check */
    _Atomic uint64_t card_last;           /* the instance's last figure, x1000 (share unknown) */
    _Atomic uint32_t card_steady;         /* its figures in a row within 6 points of the one before */
    _Atomic uint64_t est_own;             /* the own use last estimated from the others' figure, x1000 */
    _Atomic uint64_t est_rate;            /* ... and what the container spent then (0: no such estimate) */
};

#define VC_PROBE_ENDING 4u          /* vc_throttle.probe while a probe's end is written (probe_ns: since when) */
#define VC_PROBE_HOLD (INT64_MIN / 4) /* vc_throttle.tokens while a probe holds the container's launches */

struct vc_shm {
    uint32_t magic;
    uint32_t version;
    uint32_t size;
    uint32_t pad;
    pthread_mutex_t lock;
    uint64_t used[VC_MAX_DEV];     /* sum of slots' used */
    uint64_t overhead[VC_MAX_DEV]; /* sum of slots' overhead */
    struct vc_throttle thr[VC_MAX_DEV];
    struct vc_slot slots[VC_MAX_SLOTS];
};

/* How the compute limiter measures the container's use of a device. */
enum vc_measure {
    VC_MEASURE_PROCESS = 0,  /* NVML per-process SM utilisation of the container's PIDs */
    VC_MEASURE_DEVICE = 1,   /* NVML device utilisation (per-process not supported) */
    VC_MEASURE_NONE = 2,     /* no measure: the limit is not enforced */
    VC_MEASURE_GPM = 3       /* a MIG instance: GPM per-instance SM utilisation (Hopper and later) */
};

/* Map (creating if needed) the region for this container. Falls back to a
 * private region if the shared one cannot be used. Never fails. */
struct vc_shm *vc_shm_attach(const char *shared_dir, const char *key_path_a, const char *key_path_b);
/* Take a slot for this process (pid, host pid), freeing the slots of
 * processes that are gone if none is free: 0, or -1 when all VC_MAX_SLOTS
 * belong to live processes (this process then gets no device memory). */
int vc_shm_claim(struct vc_shm *s, int host_pid);
/* Claim a slot unless this process already has one (same answer). */
int vc_shm_claim_if_needed(struct vc_shm *s, int host_pid);
/* Does this process hold a slot? */
int vc_shm_has_slot(void);
/* Forget this process's slot (after fork, in the child), and let go of the
 * parent's file description (the child locks its own slot). */
void vc_shm_forget_slot(struct vc_shm *s);
/* Give back this process's slot and its usage (normal exit). */
void vc_shm_release_slot(struct vc_shm *s);

/* Reserve bytes on device slot d if used + overhead + bytes <= limit.
 * 0 = reserved, -1 = over the limit, -2 = this process has no slot (its
 * bytes could not be given back at its death: never reserved).
 * limit VC_NO_CAP = no limit (still counted). */
int vc_shm_reserve(struct vc_shm *s, int d, uint64_t bytes, uint64_t limit);
void vc_shm_unreserve(struct vc_shm *s, int d, uint64_t bytes);
/* Memory the container uses on d (allocations + overhead). */
uint64_t vc_shm_in_use(struct vc_shm *s, int d);
/* Set this process's overhead on d. */
void vc_shm_set_overhead(struct vc_shm *s, int d, uint64_t bytes);
/* This process's counted bytes on d. */
uint64_t vc_shm_own_used(struct vc_shm *s, int d);
/* Free the slots of processes that are gone. */
void vc_shm_sweep(struct vc_shm *s);
/* Path of the shared file ("" for a private region). */
const char *vc_shm_path(void);
/* Host pids of the live processes of the container (up to cap); processes
 * whose host pid is unknown are not listed. */
int vc_shm_host_pids(struct vc_shm *s, int *out, int cap);
/* Record which device slots this process can measure (bit d = slot d). */
void vc_shm_set_nvml(struct vc_shm *s, uint32_t mask);
/* Can any process of the container (not yet swept) measure device slot d? */
int vc_shm_nvml_anyone(struct vc_shm *s, int d);
/* Does a live process of the container have an unknown host pid? */
int vc_shm_any_unknown_pid(struct vc_shm *s);

#endif
