/* The compute limiter's core: the token bucket every launch spends from
 * (refill, and vc_throttle_wait() for a launch that finds it empty),
 * configuration (the share, hard or soft, the ceiling), attaching a device
 * slot to the container's shared controller state and choosing how the slot
 * is measured (per process, the card, a MIG instance's GPM figures, or not at
 * all), the feedback controller that sets the refill rate from what was
 * measured, and the memory overhead check. Sampling NVML and GPM is
 * vc_sample.c's, the probe of a MIG instance shared with other containers is
 * vc_probe.c's, and the thread that drives all of it is vc_watcher.c's; what
 * the parts share is declared in vc_throttle_int.h. */
#define _GNU_SOURCE
#include "vc_throttle_int.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "vc_log.h"
#include "vc_state.h"
#include "vc_status.h"

struct vc_throttle *vc_thr[VC_MAX_DEV];
_Atomic uint64_t vc_cost_avg;

#define REFILL_MIN_NS 1000000ull        /* refill at most every 1 ms */
#define REFILL_MAX_GAP_NS 100000000ull  /* credit at most 100 ms of idle time */
#define BURST_NS 50000000ull            /* bucket holds 50 ms worth */
#define CTRL_PERIOD_NS 100000000ull     /* controller step every 100 ms */
#define RAMP_PERIOD_NS 10000000ull     /* while ramping up: step on each new NVML sample, polled every 10 ms */
#define RAMP_MAX 64.0                   /* step factor cap (before the square root) far below the target */
#define SOFT_MARGIN 50                  /* per mille left free when borrowing */
#define STALE_NS 1000000000ull          /* controller not stepped for 1 s: its state is stale */
#define GPM_STEP_NS 105000000ull        /* GPM mode: controller step every 105 ms */
#define DAMP_MIN 0.81                   /* GPM, share not learnt: step factor bounds (before the square root) */
#define DAMP_MAX 1.21

static struct {
    int target_x1000; /* the share */
    int hard;
    int ceiling_x1000;
    struct vc_shm *shm;
} cfg;

void vc_throttle_configure(int core_limit, int hard, int ceiling)
{
    cfg.target_x1000 = core_limit * 10;
    cfg.hard = hard;
    cfg.ceiling_x1000 = (ceiling <= 0 || ceiling > 100) ? 1000 : ceiling * 10;
    if (cfg.ceiling_x1000 < cfg.target_x1000)
        cfg.ceiling_x1000 = cfg.target_x1000;
}

/* Forget what the controller learned: the next launch starts it afresh. */
static void cold_reset(struct vc_throttle *t)
{
    atomic_store(&t->rate, 0);
    atomic_store(&t->tokens, 0);
    atomic_store(&t->refill_ns, 0);
    atomic_store(&t->throttled, 0);
    atomic_store(&t->ctrl_added, atomic_load(&t->added));
    atomic_store(&t->ctrl_tokens, 0);
    atomic_store(&t->ctrl_ok_ns, 0);
    atomic_store(&t->dev_util_ns, 0);
    atomic_store(&t->last_sample_ns, 0);
    atomic_store(&t->last_seen_ts, 0); /* the next answer is a baseline, not a measurement */
    atomic_store(&t->unit_x1e12, 0);
    atomic_store(&t->ramping, 0);
    atomic_store(&t->blind, 0);
    atomic_store(&t->probe, 0);
    atomic_store(&t->others_idle_ns, 0);
    atomic_store(&t->probe_next_ns, 0);
    atomic_store(&t->probe_first, 0);
    atomic_store(&t->probe_fails, 0);
    atomic_store(&t->settled, 0);
    atomic_store(&t->guess_x1e12, 0);
    atomic_store(&t->pending_x1e12, 0);
}

static struct vc_throttle *attach(int slot, struct vc_shm *shm)
{
    cfg.shm = shm;
    struct vc_throttle *t = &shm->thr[slot];
    /* If no process of the container has stepped this controller for a while,
     * what it learned belongs to a workload that is gone: start cold, from
     * the next launch's cost, instead of letting a new workload burst at an
     * old rate. */
    uint64_t now = now_ns(), last = atomic_load(&t->ctrl_ns); /* last > now: a step since the clock was read */
    if ((last == 0 || (now > last && now - last > STALE_NS)) &&
        atomic_compare_exchange_strong(&t->ctrl_ns, &last, now)) {
        cold_reset(t);
        atomic_store(&t->none_local, 0);
        atomic_store(&t->mode, VC_MEASURE_PROCESS);
    }
    vc_thr[slot] = t;
    return t;
}

void vc_throttle_enable(int slot, struct vc_shm *shm)
{
    struct vc_throttle *t = attach(slot, shm);
    int m = vc_sample_probe_mig(slot);
    unsigned cur = atomic_load(&t->mode);
    if (m == 1 && cur != VC_MEASURE_GPM) {
        vc_throttle_set_mode(slot, t, cur, VC_MEASURE_GPM,
                             "a MIG instance (no per-process utilisation inside MIG); its card has GPM");
    } else if (m == 0 && cur != VC_MEASURE_NONE) {
        atomic_store(&t->none_local, 0); /* not for lack of NVML: no process can measure it */
        vc_throttle_set_mode(
            slot, t, cur, VC_MEASURE_NONE,
            "a MIG instance on a card without GPM: no per-process, device or per-instance utilisation");
    } else if (m == 0 && (atomic_fetch_or(&t->warned, 1u) & 1u) == 0) {
        VC_WARN("device slot %d: a MIG instance on a card without GPM, so its compute limit is not enforced "
                "(memory is still limited)", slot);
    }
}

/* Change how device slot s is measured (once per change, by whichever
 * process sees it first), tell the agent through the status file, and warn. */
void vc_throttle_set_mode(int s, struct vc_throttle *t, unsigned from, unsigned to, const char *why)
{
    if (!atomic_compare_exchange_strong(&t->mode, &from, to))
        return;
    if (to == VC_MEASURE_PROCESS || (to == VC_MEASURE_GPM && from == VC_MEASURE_NONE))
        cold_reset(t); /* from not enforced: start afresh from the next launch (not from its free-run tokens) */
    if (to == VC_MEASURE_NONE)
        atomic_store(&t->tokens, INT64_MAX / 2); /* release every waiting launch */
    vc_status_write(cfg.shm ? cfg.shm : vc.shm);
    if (to == VC_MEASURE_GPM && (atomic_fetch_or(&t->warned, 4u) & 4u) == 0)
        VC_INFO("device slot %d: %s; its compute limit is enforced from the instance's GPM SM utilisation", s, why);
    else if (to == VC_MEASURE_DEVICE && (atomic_fetch_or(&t->warned, 2u) & 2u) == 0)
        VC_WARN("device slot %d: %s; its compute limit is enforced from the device's utilisation", s, why);
    else if (to == VC_MEASURE_NONE && (atomic_fetch_or(&t->warned, 1u) & 1u) == 0)
        VC_WARN("device slot %d: NVML reports no utilisation for it (%s), so its compute limit is not enforced "
                "(running unthrottled; memory is still limited)",
                s, why);
    else if (to == VC_MEASURE_PROCESS)
        VC_INFO("device slot %d: %s; its compute limit is enforced again", s, why);
}

/* This process cannot measure device slot s (its NVML has no handle for it).
 * Its launches still spend from the container's bucket; the limit is given up
 * only while no process of the container can measure the device, and taken
 * up again by the first one that can (see watch_measure() in vc_watcher.c). */
void vc_throttle_unmeasurable(int slot, struct vc_shm *shm, int dev, const char *why)
{
    VC_DEBUG("device %d (slot %d) cannot be measured by this process: %s", dev, slot, why);
    struct vc_throttle *t = attach(slot, shm);
    unsigned cur = atomic_load(&t->mode);
    if (vc_shm_nvml_anyone(shm, slot)) {
        VC_INFO("device slot %d: %s in this process; the container's other processes measure its use", slot, why);
        return;
    }
    if (cur != VC_MEASURE_NONE) {
        atomic_store(&t->none_local, 1);
        vc_throttle_set_mode(slot, t, cur, VC_MEASURE_NONE, why);
    } else if ((atomic_fetch_or(&t->warned, 1u) & 1u) == 0) {
        VC_WARN("device slot %d: %s, so its compute limit is not enforced", slot, why);
    }
}

static uint64_t last_overhead[VC_MAX_DEV];

void vc_throttle_after_fork(void)
{
    vc_watcher_after_fork(); /* the parent's thread is not in the child */
    memset(last_overhead, 0, sizeof(last_overhead)); /* the parent's overhead is not the child's */
    vc_sample_after_fork();  /* the child's first samples are baselines */
}

int vc_throttle_share_x1000(void)
{
    return cfg.target_x1000;
}

void vc_throttle_refill(struct vc_throttle *t, uint64_t now)
{
    uint64_t last = atomic_load_explicit(&t->refill_ns, memory_order_relaxed);
    if (now <= last || now - last < REFILL_MIN_NS)
        return;
    uint64_t rate = atomic_load_explicit(&t->rate, memory_order_relaxed);
    if (rate == 0)
        return;
    uint64_t gap = now - last;
    uint64_t next_last;
    double add;
    if (gap > REFILL_MAX_GAP_NS || last == 0) {
        add = (double)rate * (double)REFILL_MAX_GAP_NS / 1e9;
        next_last = now;
    } else {
        /* Whole tokens only; the time the remainder stands for is carried. */
        add = (double)(uint64_t)((double)rate * (double)gap / 1e9);
        if (add < 1.0)
            return;
        next_last = last + (uint64_t)(add * 1e9 / (double)rate);
    }
    if (!atomic_compare_exchange_strong(&t->refill_ns, &last, next_last))
        return; /* another thread or process did this refill */
    double capd = (double)rate * (double)BURST_NS / 1e9;
    int64_t cap = capd > 4e18 ? INT64_MAX / 2 : (int64_t)capd + 1;
    int64_t cur = atomic_load_explicit(&t->tokens, memory_order_relaxed);
    for (;;) {
        double nd = (double)cur + add;
        int64_t next = nd > (double)cap ? cap : (int64_t)nd;
        if (next <= cur)
            break;
        if (atomic_compare_exchange_weak(&t->tokens, &cur, next)) {
            atomic_fetch_add_explicit(&t->added, (uint64_t)(next - cur), memory_order_relaxed);
            break;
        }
    }
}

void vc_throttle_wait(struct vc_throttle *t, uint64_t cost)
{
    atomic_fetch_add(&t->tokens, (int64_t)cost); /* undo the hot path's take */
    atomic_store(&t->throttled, 1);
    uint64_t zero = 0;
    if (atomic_load(&t->rate) == 0 && atomic_compare_exchange_strong(&t->rate, &zero, cost * 100 + 1)) {
        /* First launch on this device: start at ~100 launches of this size a second;
         * the controller takes it from there. */
        atomic_store(&t->refill_ns, now_ns());
        atomic_fetch_add(&t->tokens, (int64_t)cost);
    }
    for (;;) {
        if (atomic_load_explicit(&t->mode, memory_order_relaxed) == VC_MEASURE_NONE)
            return; /* nothing to measure by: not enforced */
        if (atomic_load_explicit(&t->tokens, memory_order_relaxed) > 0) {
            if (atomic_fetch_sub(&t->tokens, (int64_t)cost) > 0)
                return;
            atomic_fetch_add(&t->tokens, (int64_t)cost);
        }
        struct timespec ts = {0, 500000};
        nanosleep(&ts, NULL);
        uint64_t now = now_ns();
        vc_probe_abandon(t, now);   /* nor on the process that holds the launches for a probe */
        vc_throttle_refill(t, now); /* do not depend on the watcher being alive */
        atomic_store_explicit(&t->throttled, 1, memory_order_relaxed);
    }
}

/* sqrt for f in [0.5, 64] without libm: Newton's method converges in a few steps. */
static double root(double f)
{
    double x = (f + 1.0) / 2.0;
    for (int i = 0; i < 8; i++)
        x = (x + f / x) / 2.0;
    return x;
}

/* NVML sees none of the container's use while it waits for tokens and the
 * card is busy with others, several steps in a row: its PIDs are not the ones
 * NVML reports, and climbing on that would lift the limit. */
#define BLIND_STEPS 4
static int blind(struct vc_throttle *t, uint64_t own, uint64_t other)
{
    if (own == 0 && other >= 100 && atomic_load(&t->throttled))
        return atomic_fetch_add(&t->blind, 1) + 1 >= BLIND_STEPS;
    atomic_store(&t->blind, 0);
    return 0;
}

void vc_throttle_control(int s, struct vc_throttle *t, uint64_t now)
{
    uint64_t last = atomic_load(&t->ctrl_ns);
    unsigned mode = atomic_load(&t->mode);
    /* Eager: per-process samples are what a held-back container waits for to
     * climb (a cold start, or a fast ramp): poll for them instead of stepping
     * on a fixed beat. Never when idle (polling NVML costs), nor in device
     * mode (device utilisation is always there, so it would step on old news). */
    int eager = mode == VC_MEASURE_PROCESS &&
                (atomic_load(&t->ramping) || (atomic_load(&t->last_seen_ts) == 0 && atomic_load(&t->throttled)));
    uint64_t gap = eager ? RAMP_PERIOD_NS : (mode == VC_MEASURE_GPM ? GPM_STEP_NS : CTRL_PERIOD_NS - CTRL_PERIOD_NS / 10);
    /* now < last: another process stepped after this one read the clock (its
     * step is newer; now - last would wrap and look long overdue). */
    if (last && (now < last || now - last < gap))
        return;
    if (!atomic_compare_exchange_strong(&t->ctrl_ns, &last, now))
        return; /* another process of the container steps this device */
    if (mode == VC_MEASURE_NONE)
        return;
    if (mode == VC_MEASURE_GPM && vc_probe_step(s, t, now))
        return;
    /* What the container really spent since the last step (tokens added minus
     * the change in the bucket). */
    uint64_t added = atomic_load(&t->added);
    int64_t tokens = atomic_load(&t->tokens);
    int64_t spent = (int64_t)(added - atomic_load(&t->ctrl_added)) - (tokens - atomic_load(&t->ctrl_tokens));
    uint64_t since = atomic_load(&t->ctrl_ok_ns); /* what was spent is counted from the last measured step */
    double spent_rate = since && now > since && spent > 0 ? (double)spent * 1e9 / (double)(now - since) : 0.0;
    uint64_t own = 0, other = 0;
    int rc = -1;
    if (mode == VC_MEASURE_PROCESS && vc_shm_any_unknown_pid(vc.shm)) {
        vc_throttle_set_mode(s, t, mode, VC_MEASURE_DEVICE,
                             "the host PID of a process of the container is unknown, so NVML's per-process "
                             "utilisation cannot be attributed to it");
        mode = VC_MEASURE_DEVICE;
    }
    if (mode == VC_MEASURE_PROCESS) {
        rc = vc_sample_process(s, t, now, &own, &other);
        if (rc == -2) {
            vc_throttle_set_mode(s, t, mode, VC_MEASURE_DEVICE,
                                 "NVML does not report per-process utilisation (not supported)");
            mode = VC_MEASURE_DEVICE;
        } else if (rc == 0 && vc_sample_unlisted(s, own, spent)) {
            vc_throttle_set_mode(s, t, mode, VC_MEASURE_DEVICE,
                                 "NVML lists none of this container's processes on the device while it launches "
                                 "work there (its host PIDs are not the ones NVML reports)");
            mode = VC_MEASURE_DEVICE;
        } else if (rc == 0 && blind(t, own, other)) {
            vc_throttle_set_mode(s, t, mode, VC_MEASURE_DEVICE,
                                 "NVML's per-process utilisation shows none of this container's use while it "
                                 "launches on a busy card (its PIDs are not the ones NVML reports)");
            mode = VC_MEASURE_DEVICE;
        }
    }
    if (mode == VC_MEASURE_DEVICE || mode == VC_MEASURE_GPM) {
        rc = vc_sample_device(s, t, now, spent_rate, &own, &other);
        if (rc == -2) {
            vc_throttle_set_mode(s, t, mode, VC_MEASURE_NONE,
                                 mode == VC_MEASURE_GPM ? "the card gives no GPM samples for the MIG instance"
                                                        : "neither per-process nor device utilisation is supported");
            return;
        }
    }
    if (rc != 0) {
        uint64_t mine = now;
        if (rc == 1 && eager)
            atomic_compare_exchange_strong(&t->ctrl_ns, &mine, last); /* nothing new: this was no step */
        return;
    }
    atomic_store(&t->ctrl_added, added);
    atomic_store(&t->ctrl_tokens, tokens);
    atomic_store(&t->ctrl_ok_ns, now);
    uint64_t other_s = atomic_load(&t->other_x1000);
    other_s = (other_s + other) / 2;
    atomic_store(&t->other_x1000, other_s);
    atomic_store(&t->own_x1000, own);
    int64_t target = cfg.target_x1000;
    if (!cfg.hard) {
        /* Soft: borrow what the others leave idle, up to the ceiling. */
        int64_t idle = 1000 - (int64_t)other_s - SOFT_MARGIN;
        if (idle > target)
            target = idle;
        if (target > cfg.ceiling_x1000)
            target = cfg.ceiling_x1000;
    }
    atomic_store(&t->target_x1000, (uint64_t)target);
    uint64_t rate = atomic_load(&t->rate);
    if (rate == 0)
        return;
    int throttled = atomic_exchange(&t->throttled, 0) != 0;
    double f = 1.0;
    if (own > 0) {
        if ((int64_t)own < target && !throttled)
            f = 1.0; /* the application asks for less than it may have */
        else
            f = (double)target / (double)own;
    } else if (throttled) {
        f = RAMP_MAX; /* held back, yet its use is below what NVML can see */
    }
    /* Far below the target while held back: the container's own evidence (it
     * waits for tokens, yet uses a small fraction of its share) says the rate
     * is far too low, so climb fast (up to x8 a step) instead of doubling.
     * Not when NVML sees none of it on a card others keep busy: that may be
     * NVML not seeing it at all (see blind()), so at most double. */
    int unseen_on_busy = own == 0 && other >= 100;
    double fmax = throttled && (int64_t)own * 4 < target && !unseen_on_busy ? RAMP_MAX : 4.0;
    if (f < 0.5)
        f = 0.5;
    if (f > fmax)
        f = fmax;
    if (mode == VC_MEASURE_GPM && atomic_load(&t->unit_x1e12) == 0) {
        /* Sharing a MIG instance with no learnt share: small steps (x0.9 to
         * x1.1), so that this container's use stays steady through a
         * neighbour's probe (see vc_probe_step()) and a neighbour's pause or
         * return moves it little; but far below its share it climbs back
         * (doubling at most), which moves its use by a few points only. */
        double hi = (int64_t)own * 4 < target ? (fmax < 4.0 ? fmax : 4.0) : DAMP_MAX;
        f = f < DAMP_MIN ? DAMP_MIN : (f > hi ? hi : f);
    }
    atomic_store(&t->ramping, mode == VC_MEASURE_PROCESS && fmax == RAMP_MAX && f > 4.0);
    /* When the container is over its share while spending less than the
     * rate allows (the driver's queue, not the bucket, holds it back),
     * correct from what it spent, or the rate would take many steps to come
     * down from a level it does not even use. */
    double base = (double)rate;
    if ((int64_t)own > target && spent_rate > 0 && spent_rate < base)
        base = spent_rate;
    double next = base * root(f);
    if (next < 1.0)
        next = 1.0;
    if (next > 1e15)
        next = 1e15;
    atomic_store(&t->rate, (uint64_t)next);
    if (next >= (double)rate * 0.88 && next <= (double)rate * 1.12) {
        if (atomic_load(&t->settled) < SETTLED_STEPS)
            atomic_fetch_add(&t->settled, 1);
    } else {
        atomic_store(&t->settled, 0);
    }
    /* A lower rate also means a smaller bucket: tokens saved up at the old rate
     * must not let the container run on unchecked. */
    int64_t cap = next * (double)BURST_NS / 1e9 > 4e18 ? INT64_MAX / 2 : (int64_t)(next * (double)BURST_NS / 1e9) + 1;
    int64_t cur = atomic_load(&t->tokens);
    while (cur > cap && !atomic_compare_exchange_weak(&t->tokens, &cur, cap)) {
    }
    VC_DEBUG("slot %d: own %.1f%% other %.1f%% target %.1f%% rate %.0f -> %.0f", s, own / 10.0, other / 10.0,
             target / 10.0, (double)rate, next);
}

/* NVML reports what this process really holds on the device; what the shim
 * did not count (contexts, modules, driver allocations) is its overhead.
 * A sample taken while this process allocated or freed is thrown away (the
 * two readings would not describe the same moment), and overhead must be seen
 * in two consecutive samples before it counts, so a passing allocation is
 * never mistaken for overhead. */
void vc_throttle_overhead(int s)
{
    if (!vc.nvml[s])
        return;
    uint64_t gen = atomic_load(&vc_mem_gen);
    uint64_t own_counted = vc_shm_own_used(vc.shm, s);
    unsigned listed[64];
    unsigned long long mem[64];
    int n = vc_sample_running(s, listed, mem, 64);
    if (n < 0 || n > 64 || atomic_load(&vc_mem_gen) != gen)
        return; /* more than 64 processes on the device: none of them listed, this one's use unknown */
    for (int i = 0; i < n; i++) {
        if ((int)listed[i] == vc.host_pid) {
            uint64_t now = mem[i] > own_counted ? mem[i] - own_counted : 0;
            uint64_t confirmed = now < last_overhead[s] ? now : last_overhead[s];
            last_overhead[s] = now;
            vc_shm_set_overhead(vc.shm, s, confirmed);
            return;
        }
    }
}
