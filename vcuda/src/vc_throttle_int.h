/* Private to the compute limiter, shared by its four parts and by nothing
 * else in the shim: vc_throttle.c (the token bucket, the launch wait,
 * configuration, how a device is measured, and the controller),
 * vc_sample.c (NVML and GPM sampling), vc_probe.c (the probe of a MIG
 * instance shared with other containers) and vc_watcher.c (the thread that
 * refills and steps the controller). Every function here is hidden (the shim
 * is built with -fvisibility=hidden); the per-device state the processes of a
 * container share is struct vc_throttle in the shared memory (vc_shm.h). */
#ifndef VC_THROTTLE_INT_H
#define VC_THROTTLE_INT_H

#include <stdint.h>
#include <time.h>

#include "vc_throttle.h"

#define SLOW_PERIOD_NS 1000000000ull    /* memory overhead and sweep every second */
#define SETTLED_STEPS 2                 /* a probe learns from a rate that moved under 12 % in its last 2 steps */

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* vc_throttle.c: the bucket and the controller. */
void vc_throttle_refill(struct vc_throttle *t, uint64_t now);
void vc_throttle_set_mode(int s, struct vc_throttle *t, unsigned from, unsigned to, const char *why);
void vc_throttle_control(int s, struct vc_throttle *t, uint64_t now);
void vc_throttle_overhead(int s);
int vc_throttle_share_x1000(void); /* the container's share (its core limit), x1000 */

/* vc_sample.c: NVML and GPM sampling. */
int vc_sample_probe_mig(int s);
int vc_sample_process(int s, struct vc_throttle *t, uint64_t now, uint64_t *own, uint64_t *other);
int vc_sample_device(int s, struct vc_throttle *t, uint64_t now, double spent_rate, uint64_t *own, uint64_t *other);
int vc_sample_unlisted(int s, uint64_t own, int64_t spent);
int vc_sample_running(int s, unsigned *pids, unsigned long long *mem, int cap);
int vc_sample_gpm(int s, uint64_t now, uint64_t *inst);
uint64_t vc_sample_gpm_window(int s); /* where the last GPM figure's window began */
void vc_sample_gpm_forget(int s);     /* the next GPM sample is a baseline */
void vc_sample_after_fork(void);

/* vc_probe.c: the probe of a shared MIG instance. */
void vc_probe_start(struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate);
int vc_probe_step(int s, struct vc_throttle *t, uint64_t now);
void vc_probe_abandon(struct vc_throttle *t, uint64_t now);
void vc_probe_check(struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate);

/* vc_watcher.c: the watcher thread. */
void vc_watcher_after_fork(void);

#endif
