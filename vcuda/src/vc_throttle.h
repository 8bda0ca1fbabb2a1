/* The compute limiter. Every launch spends cost units (blocks x threads)
 * from a token bucket the container's processes share per device; the
 * bucket refills at a rate a feedback controller sets from NVML's per-process
 * SM utilisation of the container's host PIDs. The controller is
 * multiplicative (rate *= sqrt(target / measured)), so it needs no knowledge
 * of the GPU's size: the same code holds 30 % on an 8-SM and a 188-SM card.
 * The launch hot path is one atomic subtraction: no system call, no file
 * read, no getenv. */
#ifndef VC_THROTTLE_H
#define VC_THROTTLE_H

#include <stdatomic.h>
#include <stdint.h>

#include "vc_common.h"
#include "vc_shm.h"

/* Per slot; NULL when the slot is not throttled. */
extern struct vc_throttle *vc_thr[VC_MAX_DEV];
extern _Atomic uint64_t vc_cost_avg;

void vc_throttle_configure(int core_limit, int hard, int ceiling);
void vc_throttle_enable(int slot, struct vc_shm *shm);
void vc_throttle_wait(struct vc_throttle *t, uint64_t cost);
/* Device slot `slot` cannot be measured at all: not enforced, said once. */
void vc_throttle_unmeasurable(int slot, struct vc_shm *shm, int dev, const char *why);
void vc_throttle_after_fork(void);
void vc_watcher_start(void);

static inline void vc_throttle_charge(int slot, uint64_t cost)
{
    if (slot < 0)
        return;
    struct vc_throttle *t = vc_thr[slot];
    if (!t)
        return;
    if (VC_LIKELY(atomic_fetch_sub_explicit(&t->tokens, (int64_t)cost, memory_order_relaxed) > 0))
        return;
    vc_throttle_wait(t, cost);
}

/* Running average of kernel costs in this process (for graph launches). */
static inline void vc_cost_note(uint64_t cost)
{
    uint64_t a = atomic_load_explicit(&vc_cost_avg, memory_order_relaxed);
    atomic_store_explicit(&vc_cost_avg, a ? a - a / 16 + cost / 16 : cost, memory_order_relaxed);
}

#endif
