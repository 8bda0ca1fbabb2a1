#define _GNU_SOURCE
#include "vc_throttle.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vc_hooks.h"
#include "vc_log.h"
#include "vc_pfn.h"
#include "vc_state.h"
#include "vc_status.h"

struct vc_throttle *vc_thr[VC_MAX_DEV];
_Atomic uint64_t vc_cost_avg;

#define REFILL_MIN_NS 1000000ull        /* refill at most every 1 ms */
#define REFILL_MAX_GAP_NS 100000000ull  /* credit at most 100 ms of idle time */
#define BURST_NS 50000000ull            /* bucket holds 50 ms worth */
#define CTRL_PERIOD_NS 100000000ull     /* controller step every 100 ms */
#define WATCH_TICK_NS 5000000ull        /* watcher wakes every 5 ms */
#define SLOW_PERIOD_NS 1000000000ull    /* memory overhead and sweep every second */
#define NO_SAMPLE_MIN_NS 250000000ull   /* no NVML sample for 2.5 sampling periods (at least 250 ms, */
#define NO_SAMPLE_MAX_NS 2000000000ull  /* at most 2 s; 1 s while the period is unknown) = below NVML's */
#define NO_SAMPLE_UNKNOWN_NS 1000000000ull /* resolution */
#define RAMP_PERIOD_NS 10000000ull     /* while ramping up: step on each new NVML sample, polled every 10 ms */
#define RAMP_MAX 64.0                   /* step factor cap (before the square root) far below the target */
#define SOFT_MARGIN 50                  /* per mille left free when borrowing */
#define STALE_NS 1000000000ull          /* controller not stepped for 1 s: its state is stale */
#define GPM_MIN_NS 100000000ull         /* GPM: at least 100 ms between two samples (NVML's refresh) */
#define GPM_STEP_NS 105000000ull        /* GPM mode: controller step every 105 ms */
#define GPM_OLD_NS 2000000000ull        /* a previous GPM sample older than 2 s is a baseline only */
#define PROBE_DRAIN_NS 20000000ull      /* probe: launches held this long before the baseline sample */
#define PROBE_MAX_NS 1000000000ull      /* probe: given up after 1 s (the container launches again) */
#define PROBE_RETRY_NS 300000000ull     /* a probe that taught nothing: again in 0.3-1.5 s, the delay doubling */
#define PROBE_RETRY_STEPS 2             /* ... for each one in a row that taught nothing, up to 1.2-6 s */
#define PROBE_RELEARN_NS 1000000000ull  /* the others' use known, the container's share not: again in 1-2 s */
#define OTHERS_KEEP_NS 5000000000ull    /* the others' figure stands for their use this long (share unknown) */
#define PROBE_ABANDON_NS 2000000000ull  /* a probe still holding launches after 2 s is ended by whoever waits */
#define DAMP_MIN 0.81                   /* GPM, share not learnt: step factor bounds (before the square root) */
#define DAMP_MAX 1.21
#define SETTLED_STEPS 2                 /* a probe learns from a rate that moved under 12 % in its last 2 steps */
#define IDLE_MAX 50                     /* per mille: others below this in a probe may be probing too */
#define LEARN_MIN 50                    /* per mille: the least rest of the figure a share is learnt from */
#define PROBE_BIAS 1.1                  /* a share learned by a probe is taken this much larger */
#define PROBE_HOLD (INT64_MIN / 4)      /* tokens while a probe holds the container's launches */
#define PROBE_ENDING 4u                 /* probe phase while its end is being written */

static struct {
    int target_x1000; /* the share */
    int hard;
    int ceiling_x1000;
    struct vc_shm *shm;
} cfg;

static atomic_int watcher_running;

/* A MIG instance as this process's NVML sees it: GPM samples are taken on its
 * card for its GPU instance. Process-local (sample buffers belong to this
 * process's NVML); the controller step goes to whichever process of the
 * container wins it, and each keeps its own previous sample. The two sample
 * buffers are allocated once per device at CUDA start (probe_mig) and kept
 * for the process's life: never freed while the watcher may still sample. */
static struct gpm_dev {
    int mig;                /* the slot's device is a MIG instance */
    nvmlDevice_t parent;    /* its card */
    unsigned int gi;        /* its GPU instance ID */
    nvmlGpmSample_t prev, cur;
    uint64_t prev_ns;       /* when prev was taken, 0 = none */
    uint64_t window_ns;     /* where the last figure's window began */
} gpm[VC_MAX_DEV];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
}

static struct vc_throttle *attach(int slot, struct vc_shm *shm)
{
    cfg.shm = shm;
    struct vc_throttle *t = &shm->thr[slot];
    /* If no process of the container has stepped this controller for a while,
     * what it learned belongs to a workload that is gone: start cold, from
     * the next launch's cost, instead of letting a new workload burst at an
     * old rate. */
    uint64_t now = now_ns(), last = atomic_load(&t->ctrl_ns);
    if ((last == 0 || now - last > STALE_NS) && atomic_compare_exchange_strong(&t->ctrl_ns, &last, now)) {
        cold_reset(t);
        atomic_store(&t->none_local, 0);
        atomic_store(&t->mode, VC_MEASURE_PROCESS);
    }
    vc_thr[slot] = t;
    return t;
}

static void set_mode(int s, struct vc_throttle *t, unsigned from, unsigned to, const char *why);

/* Is device slot s a MIG instance, and can its card give GPM samples for
 * it? 1 GPM, 0 MIG without GPM, -1 not a MIG instance (or NVML cannot say). */
static int probe_mig(int s)
{
    nvmlDevice_t h = vc.nvml[s];
    unsigned int is_mig = 0, gi = 0;
    if (!h || !REAL_I(nvmlDeviceIsMigDeviceHandle) || REAL_I(nvmlDeviceIsMigDeviceHandle)(h, &is_mig) != NVML_SUCCESS ||
        !is_mig)
        return -1;
    gpm[s].mig = 1;
    nvmlDevice_t parent = NULL;
    if (!REAL_I(nvmlDeviceGetDeviceHandleFromMigDeviceHandle) || !REAL_I(nvmlDeviceGetGpuInstanceId) ||
        REAL_I(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)(h, &parent) != NVML_SUCCESS ||
        REAL_I(nvmlDeviceGetGpuInstanceId)(h, &gi) != NVML_SUCCESS)
        return 0;
    nvmlGpmSupport_t sup = {.version = NVML_GPM_SUPPORT_VERSION, .isSupportedDevice = 0};
    if (!REAL_I(nvmlGpmQueryDeviceSupport) || !REAL_I(nvmlGpmSampleAlloc) || !REAL_I(nvmlGpmMigSampleGet) ||
        !REAL_I(nvmlGpmMetricsGet) || REAL_I(nvmlGpmQueryDeviceSupport)(parent, &sup) != NVML_SUCCESS ||
        !sup.isSupportedDevice)
        return 0;
    if ((!gpm[s].prev && REAL_I(nvmlGpmSampleAlloc)(&gpm[s].prev) != NVML_SUCCESS) ||
        (!gpm[s].cur && REAL_I(nvmlGpmSampleAlloc)(&gpm[s].cur) != NVML_SUCCESS))
        return 0;
    gpm[s].parent = parent;
    gpm[s].gi = gi;
    gpm[s].prev_ns = 0;
    return 1;
}

void vc_throttle_enable(int slot, struct vc_shm *shm)
{
    struct vc_throttle *t = attach(slot, shm);
    int m = probe_mig(slot);
    unsigned cur = atomic_load(&t->mode);
    if (m == 1 && cur != VC_MEASURE_GPM) {
        set_mode(slot, t, cur, VC_MEASURE_GPM,
                 "a MIG instance (no per-process utilisation inside MIG); its card has GPM");
    } else if (m == 0 && cur != VC_MEASURE_NONE) {
        atomic_store(&t->none_local, 0); /* not for lack of NVML: no process can measure it */
        set_mode(slot, t, cur, VC_MEASURE_NONE,
                 "a MIG instance on a card without GPM: no per-process, device or per-instance utilisation");
    } else if (m == 0 && (atomic_fetch_or(&t->warned, 1u) & 1u) == 0) {
        VC_WARN("device slot %d: a MIG instance on a card without GPM, so its compute limit is not enforced "
                "(memory is still limited)", slot);
    }
}

/* Change how device slot s is measured (once per change, by whichever
 * process sees it first), tell the agent through the status file, and warn. */
static void set_mode(int s, struct vc_throttle *t, unsigned from, unsigned to, const char *why)
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
 * up again by the first one that can (see watch_measure()). */
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
        set_mode(slot, t, cur, VC_MEASURE_NONE, why);
    } else if ((atomic_fetch_or(&t->warned, 1u) & 1u) == 0) {
        VC_WARN("device slot %d: %s, so its compute limit is not enforced", slot, why);
    }
}

static uint64_t last_overhead[VC_MAX_DEV];
static int unlisted_steps[VC_MAX_DEV]; /* see unlisted() */


void vc_throttle_after_fork(void)
{
    atomic_store(&watcher_running, 0); /* the parent's thread is not in the child */
    memset(last_overhead, 0, sizeof(last_overhead)); /* the parent's overhead is not the child's */
    memset(unlisted_steps, 0, sizeof(unlisted_steps));
    for (int s = 0; s < VC_MAX_DEV; s++)
        gpm[s].prev_ns = 0; /* the child's first sample is a baseline */
}

static void refill(struct vc_throttle *t, uint64_t now)
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

static void probe_abandon(struct vc_throttle *t, uint64_t now);

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
        probe_abandon(t, now); /* nor on the process that holds the launches for a probe */
        refill(t, now);        /* do not depend on the watcher being alive */
        atomic_store_explicit(&t->throttled, 1, memory_order_relaxed);
    }
}

/* ---- the controller ---- */

static int in_set(unsigned pid, const int *set, int n)
{
    for (int i = 0; i < n; i++)
        if ((unsigned)set[i] == pid)
            return 1;
    return 0;
}

/* Read new NVML samples for device slot s: own and other utilisation x1000.
 * Returns 0 with values, 1 if there is nothing new, -1 on error, -2 when
 * NVML cannot report per-process utilisation at all. */
static int sample(int s, struct vc_throttle *t, uint64_t now, uint64_t *own, uint64_t *other)
{
    pfn_nvmlDeviceGetProcessUtilization get = REAL_I(nvmlDeviceGetProcessUtilization);
    nvmlDevice_t h = vc.nvml[s];
    if (!h)
        return -1;
    if (!get)
        return -2;
    nvmlProcessUtilizationSample_t stackbuf[64], *buf = stackbuf;
    unsigned int n = 64;
    unsigned long long last = atomic_load(&t->last_seen_ts);
    nvmlReturn_t r = get(h, buf, &n, last);
    if (r == NVML_ERROR_INSUFFICIENT_SIZE && n > 64 && n < 100000) {
        buf = malloc(n * sizeof(*buf));
        if (!buf)
            return -1;
        r = get(h, buf, &n, last);
    }
    if (r == NVML_ERROR_NOT_FOUND) {
        if (buf != stackbuf)
            free(buf);
        uint64_t ls = atomic_load(&t->last_sample_ns);
        if (!ls) {
            atomic_store(&t->last_sample_ns, now); /* NVML may not have sampled yet: wait a little */
            return 1;
        }
        uint64_t gap = atomic_load(&t->sample_gap_ns);
        uint64_t idle = gap ? gap * 5 / 2 : NO_SAMPLE_UNKNOWN_NS;
        idle = idle < NO_SAMPLE_MIN_NS ? NO_SAMPLE_MIN_NS : (idle > NO_SAMPLE_MAX_NS ? NO_SAMPLE_MAX_NS : idle);
        if (now - ls < idle)
            return 1;
        atomic_store(&t->last_sample_ns, now);
        *own = *other = 0;
        return 0;
    }
    if (r != NVML_SUCCESS) {
        if (buf != stackbuf)
            free(buf);
        return r == NVML_ERROR_NOT_SUPPORTED ? -2 : -1;
    }
    int pids[VC_MAX_SLOTS];
    int np = vc_shm_host_pids(vc.shm, pids, VC_MAX_SLOTS);
    /* A process may have several samples: average each process's, then sum. */
    uint64_t own_sum = 0, other_sum = 0, newest = last;
    for (unsigned i = 0; i < n; i++) {
        if (buf[i].timeStamp > newest)
            newest = buf[i].timeStamp;
        int first = 1;
        for (unsigned j = 0; j < i; j++)
            if (buf[j].pid == buf[i].pid)
                first = 0;
        if (!first)
            continue;
        uint64_t sum = 0, cnt = 0;
        for (unsigned j = i; j < n; j++) {
            if (buf[j].pid == buf[i].pid) {
                sum += buf[j].smUtil > 100 ? 100 : buf[j].smUtil;
                cnt++;
            }
        }
        uint64_t avg = sum * 10 / cnt; /* percent -> per mille */
        if (in_set(buf[i].pid, pids, np))
            own_sum += avg;
        else
            other_sum += avg;
    }
    if (buf != stackbuf)
        free(buf);
    atomic_store(&t->last_seen_ts, newest);
    atomic_store(&t->last_sample_ns, now);
    /* Learn NVML's sampling period from how often new samples arrive. */
    uint64_t prev = atomic_exchange(&t->last_new_ns, now);
    if (prev && now > prev && now - prev <= NO_SAMPLE_MAX_NS) { /* longer: the container was idle */
        uint64_t g = now - prev, gap = atomic_load(&t->sample_gap_ns);
        atomic_store(&t->sample_gap_ns, gap ? (gap * 3 + g) / 4 : g);
    }
    if (last == 0)
        return 1; /* the first answer averages over time before this workload began: a baseline only */
    *own = own_sum > 1000 ? 1000 : own_sum;
    *other = other_sum > 1000 ? 1000 : other_sum;
    return 0;
}

/* NVML's list of the processes with a context on device slot s: fills pids
 * (host PIDs) and mem (bytes each uses), up to cap. Returns how many it
 * listed, cap + 1 when there were more, -1 if NVML cannot say. */
static int running(int s, unsigned *pids, unsigned long long *mem, int cap)
{
    nvmlDevice_t h = vc.nvml[s];
    nvmlProcessInfo_t buf[64];
    unsigned int n = 64;
    nvmlReturn_t r = NVML_ERROR_FUNCTION_NOT_FOUND;
    int v1 = 0;
    if (!h)
        return -1;
    if (REAL_I(nvmlDeviceGetComputeRunningProcesses_v3))
        r = REAL_I(nvmlDeviceGetComputeRunningProcesses_v3)(h, &n, buf);
    else if (REAL_I(nvmlDeviceGetComputeRunningProcesses_v2))
        r = REAL_I(nvmlDeviceGetComputeRunningProcesses_v2)(h, &n, buf);
    else if (REAL_I(nvmlDeviceGetComputeRunningProcesses)) {
        v1 = 1;
        r = REAL_I(nvmlDeviceGetComputeRunningProcesses)(h, &n, (nvmlProcessInfo_v1_t *)buf);
    }
    if (r == NVML_ERROR_INSUFFICIENT_SIZE)
        return cap + 1;
    if (r != NVML_SUCCESS)
        return -1;
    int k = 0;
    for (unsigned i = 0; i < n && i < 64 && k < cap; i++, k++) {
        if (v1) {
            nvmlProcessInfo_v1_t *x = &((nvmlProcessInfo_v1_t *)buf)[i];
            pids[k] = x->pid;
            mem[k] = x->usedGpuMemory;
        } else {
            pids[k] = buf[i].pid;
            mem[k] = buf[i].usedGpuMemory;
        }
    }
    return n > (unsigned)cap ? cap + 1 : k;
}

/* Is any process outside the container running on device slot s? -1 if NVML cannot say. */
static int others_running(int s)
{
    unsigned listed[64];
    unsigned long long mem[64];
    int n = running(s, listed, mem, 64);
    if (n < 0)
        return -1;
    if (n > 64)
        return 1; /* more than 64 processes: certainly not all ours */
    int pids[VC_MAX_SLOTS];
    int np = vc_shm_host_pids(vc.shm, pids, VC_MAX_SLOTS);
    for (int i = 0; i < n; i++)
        if (!in_set(listed[i], pids, np))
            return 1;
    return 0;
}

/* Does NVML list any of the container's processes on device slot s? 1 yes,
 * 0 no, -1 it cannot say. A process that launches work has a context on the
 * device, and NVML lists every process with a context: when none of the
 * container's host PIDs is there, they are not the PIDs NVML reports. */
static int ours_listed(int s)
{
    unsigned listed[64];
    unsigned long long mem[64];
    int n = running(s, listed, mem, 64);
    if (n < 0 || n > 64)
        return n < 0 ? -1 : 1; /* more than 64: cannot tell, assume seen */
    int pids[VC_MAX_SLOTS];
    int np = vc_shm_host_pids(vc.shm, pids, VC_MAX_SLOTS);
    for (int i = 0; i < n; i++)
        if (in_set(listed[i], pids, np))
            return 1;
    return 0;
}

/* NVML's per-process figures show none of the container's use while it
 * spends tokens, and its list of processes on the device has none of the
 * container's host PIDs, twice in a row (this process's count). Unlike
 * blind(), this does not depend on the container being held back by the
 * bucket, so a rate that already climbed past the card is caught too. */
static int unlisted(int s, uint64_t own, int64_t spent)
{
    if (own != 0)
        unlisted_steps[s] = 0; /* NVML sees the container's use: its PIDs are the right ones */
    if (own != 0 || spent <= 0)
        return 0;
    int r = ours_listed(s);
    if (r != 0) {
        if (r == 1)
            unlisted_steps[s] = 0;
        return 0;
    }
    return ++unlisted_steps[s] >= 2;
}

/* Device mode: the card's utilisation, x1000. Returns 0 with a value, 1 if
 * there is nothing new, -1 on a transient error, -2 if unsupported. */
static int card_util(int s, struct vc_throttle *t, uint64_t now, uint64_t *card)
{
    pfn_nvmlDeviceGetUtilizationRates get = REAL_I(nvmlDeviceGetUtilizationRates);
    nvmlDevice_t h = vc.nvml[s];
    if (!h)
        return -1;
    if (!get)
        return -2;
    nvmlUtilization_t u;
    nvmlReturn_t r = get(h, &u);
    if (r == NVML_ERROR_NOT_SUPPORTED)
        return -2;
    if (r != NVML_SUCCESS)
        return -1;
    *card = (u.gpu > 100 ? 100 : u.gpu) * 10ull;
    /* NVML holds the figure for its whole sampling period (1/6 s to 1 s): the
     * same figure again is most likely the same sample, and stepping on it
     * twice would over-correct. Step when it changes, or after a second. */
    uint64_t changed = atomic_load(&t->dev_util_ns);
    if (atomic_exchange(&t->dev_util, *card) == *card && changed && now - changed < SLOW_PERIOD_NS)
        return 1;
    atomic_store(&t->dev_util_ns, now);
    return 0;
}

/* GPM mode: the MIG instance's SM utilisation between this process's
 * previous GPM sample and a new one (at least GPM_MIN_NS apart). */
static int gpm_util(int s, uint64_t now, uint64_t *inst)
{
    struct gpm_dev *g = &gpm[s];
    if (!g->prev || !g->cur)
        return -2;
    if (g->prev_ns && now - g->prev_ns < GPM_MIN_NS)
        return 1;
    nvmlReturn_t r = REAL_I(nvmlGpmMigSampleGet)(g->parent, g->gi, g->cur);
    if (r == NVML_ERROR_NOT_SUPPORTED)
        return -2;
    if (r != NVML_SUCCESS)
        return -1;
    uint64_t before = g->prev_ns;
    nvmlGpmSample_t x = g->prev; /* the new sample is the next one's baseline */
    g->prev = g->cur;
    g->cur = x;
    g->prev_ns = now;
    if (!before || now - before > GPM_OLD_NS)
        return 1; /* no recent baseline: this sample is one */
    static nvmlGpmMetricsGet_t m; /* ~15 KiB: not on the stack; only the watcher thread steps the controller */
    memset(&m, 0, sizeof(m));
    m.version = NVML_GPM_METRICS_GET_VERSION;
    m.numMetrics = 1;
    m.sample1 = g->cur; /* the older */
    m.sample2 = g->prev;
    m.metrics[0].metricId = NVML_GPM_METRIC_SM_UTIL;
    r = REAL_I(nvmlGpmMetricsGet)(&m);
    if (r == NVML_ERROR_NOT_SUPPORTED || (r == NVML_SUCCESS && m.metrics[0].nvmlReturn == NVML_ERROR_NOT_SUPPORTED))
        return -2;
    if (r != NVML_SUCCESS || m.metrics[0].nvmlReturn != NVML_SUCCESS)
        return -1;
    double v = m.metrics[0].value;
    v = v < 0.0 ? 0.0 : (v > 100.0 ? 100.0 : v);
    *inst = (uint64_t)(v * 10.0 + 0.5);
    g->window_ns = before;
    return 0;
}

static void probe_start(struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate);

/* What the container's share leaves of the instance, x1000: the most the
 * others can use beside it while it uses its share. */
static uint64_t rest_of_instance(void)
{
    return cfg.target_x1000 < 1000 ? 1000 - (uint64_t)cfg.target_x1000 : 0;
}

/* GPM mode with processes of other containers in the instance. With a learnt
 * share (what one cost unit per second takes of the instance, learnt alone or
 * by a probe, see probe_end()), the container's own use is its launch
 * accounting times that share. Without one, a probe is due, and the others'
 * use measured by the last probe that found it steady (and within the rest
 * of the instance: the others' limits leave this container its own) is taken
 * from the instance's figure; the rest is the container's. So it is held at
 * its share next to steady neighbours and climbs back from nothing, instead
 * of counting their use as its own (which starved a 30 % container next to a
 * 50 % one). That figure stands for OTHERS_KEEP_NS, renewed by a probe every
 * 1-2 s until the share is learnt. Only with no figure at all (no probe has
 * found one yet) does the whole figure count as its own: never more than its
 * share, possibly much less, until a probe succeeds. */
static int gpm_shared(int s, struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate, uint64_t *own,
                      uint64_t *other)
{
    double unit = (double)atomic_load(&t->unit_x1e12) / 1e12;
    uint64_t idle = atomic_load(&t->others_idle), at = atomic_load(&t->others_idle_ns);
    if (at && gpm[s].window_ns < at)
        return 1; /* the figure's window reaches back into the probe (the container's pause): no step */
    if (unit <= 0) {
        probe_start(t, now, card, spent_rate);
        if (at && now - at < OTHERS_KEEP_NS) {
            *own = card > idle ? card - idle : 0;
            /* Never less than the last probe's guess of its share per unit
             * times what it spends: a neighbour's pause (the instance's figure
             * drops) must not make it climb, or that neighbour's probe finds
             * it moving, and a neighbour that yields must not let it run away. */
            double guess = (double)atomic_load(&t->guess_x1e12) / 1e12 * spent_rate * 1000.0;
            if (guess > (double)*own)
                *own = guess < (double)card ? (uint64_t)guess : card;
            *other = card - *own;
            return 0;
        }
    }
    double est = unit > 0 && spent_rate > 0 ? unit * spent_rate * 1000.0 : (double)card;
    *own = est < (double)card ? (uint64_t)est : card;
    *other = card - *own;
    return 0;
}

/* Device and GPM modes: the card's (device mode) or the MIG instance's (GPM
 * mode) utilisation stands for the container's own when no other process
 * runs there; while that holds, the limiter also learns what share of the
 * card or instance one cost unit per second takes (its own launch
 * accounting), and uses it to estimate its own share once others arrive. In a
 * MIG instance shared with other containers, see gpm_shared(). Without that
 * estimate (device mode) it takes the whole utilisation as its own: never
 * more than its share. Returns 0 with values, 1 if there is nothing new, -1
 * on a transient error, -2 if unsupported. */
static int sample_device(int s, struct vc_throttle *t, uint64_t now, double spent_rate, uint64_t *own,
                         uint64_t *other)
{
    uint64_t card = 0;
    int rc = atomic_load(&t->mode) == VC_MEASURE_GPM ? gpm_util(s, now, &card) : card_util(s, t, now, &card);
    if (rc != 0)
        return rc;
    int foreign = others_running(s);
    double unit = (double)atomic_load(&t->unit_x1e12) / 1e12;
    if (foreign == 0) {
        *own = card;
        *other = 0;
        if (spent_rate > 0 && card >= 20 && card <= 950) {
            double k = (double)card / 1000.0 / spent_rate;
            unit = unit > 0 ? unit * 0.75 + k * 0.25 : k;
            atomic_store(&t->unit_x1e12, (uint64_t)(unit * 1e12));
        }
        return 0;
    }
    if (atomic_load(&t->mode) == VC_MEASURE_GPM)
        return gpm_shared(s, t, now, card, spent_rate, own, other);
    double est = unit > 0 && spent_rate > 0 ? unit * spent_rate * 1000.0 : (double)card;
    *own = est < (double)card ? (uint64_t)est : card;
    *other = card - *own;
    return 0;
}

/* base + a pseudo-random part of span (differs between processes and calls). */
static uint64_t jitter(uint64_t base, uint64_t span)
{
    uint64_t x = now_ns() ^ ((uint64_t)getpid() << 32);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return base + (span ? x % span : 0);
}

/* A GPM figure of this process whose whole window lies in the probe's hold
 * (after the drain): 0 with it; 1 when its window reaches back before that
 * (its previous sample was taken by this process outside the probe, and may
 * include the container's own work: the new sample is its baseline). Else
 * gpm_util()'s answer. */
static int held_util(int s, uint64_t now, uint64_t began, uint64_t *fig)
{
    int rc = gpm_util(s, now, fig);
    return rc == 0 && gpm[s].window_ns < began + PROBE_DRAIN_NS ? 1 : rc;
}

/* Start a probe (from gpm_shared()) when one is due: the container launches
 * (or waits to) and the last one ended long enough ago. probe_ns is written
 * before the phase, so probe_abandon() never judges a new probe by an old
 * start. */
static void probe_start(struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate)
{
    if ((spent_rate <= 0 && !atomic_load(&t->throttled)) || now < atomic_load(&t->probe_next_ns) ||
        atomic_load(&t->probe) != 0)
        return;
    atomic_store(&t->probe_pre, card);
    /* Learnt from only if the rate was settled: a moving one runs ahead of GPM's figure, which lags it. */
    atomic_store(&t->probe_pre_settled, atomic_load(&t->settled) >= SETTLED_STEPS);
    atomic_store(&t->probe_pre_rate, spent_rate > 0 && spent_rate < 1e18 ? (uint64_t)spent_rate : 0);
    atomic_store(&t->probe_ns, now);
    uint32_t none = 0;
    if (atomic_compare_exchange_strong(&t->probe, &none, 1)) {
        atomic_store(&t->tokens, PROBE_HOLD); /* hold the container's launches */
        VC_DEBUG("others run in the MIG instance: probing what they use");
    }
}

/* What a probe's figure of the others' use (fig) teaches of the container's
 * share: the instance's figure just before the pause minus theirs was its
 * own, at the rate it spent then. That window lies before the pause, so a
 * neighbour's reaction to the pause cannot distort it (a neighbour that
 * reacts makes the two figures of the pause differ, and teaches nothing).
 * Learnt only from a rest well above the figures' noise (a few points) and
 * at least half the container's share (a rate still climbing runs ahead of
 * GPM's figure; a share learnt from 3 % of the instance once held a 30 %
 * container at 9 %). fig is the later of the pause's two figures. Taken 10 % high, up at once, down slowly: a share
 * learnt too large holds the container a little below its limit, one learnt
 * too small would let it above. */
static void probe_learn(struct vc_throttle *t, uint64_t fig)
{
    uint64_t pre = atomic_load(&t->probe_pre), rate = atomic_load(&t->probe_pre_rate);
    /* A neighbour that climbs on the pause has climbed by its first figure
     * too: what it used before the pause is taken back along that trend. */
    uint64_t first = atomic_load(&t->probe_first);
    fig = fig > first ? (2 * first > fig ? 2 * first - fig : 0) : fig;
    uint64_t least = (uint64_t)cfg.target_x1000 / 2 > LEARN_MIN ? (uint64_t)cfg.target_x1000 / 2 : LEARN_MIN;
    uint64_t mine = pre > fig ? pre - fig : 0;
    if (rate == 0 || mine < LEARN_MIN || mine > 950) {
        atomic_store(&t->guess_x1e12, 0);
        return;
    }
    double k = (double)mine / 1000.0 / (double)rate * PROBE_BIAS;
    atomic_store(&t->guess_x1e12, (uint64_t)(k * 1e12)); /* a floor for the estimate meanwhile, see gpm_shared() */
    if (!atomic_load(&t->probe_pre_settled) || mine < least)
        return;
    double unit = (double)atomic_load(&t->unit_x1e12) / 1e12;
    unit = unit <= 0 || k > unit ? k : unit * 0.9 + k * 0.1;
    atomic_store(&t->unit_x1e12, (uint64_t)(unit * 1e12));
    VC_DEBUG("a probe found %.1f%% of the MIG instance the container's own at %" PRIu64 " units/s", mine / 10.0,
             rate);
}

/* End a probe found in `phase`, unless another process ended it first. fig:
 * the second of the others' two steady figures (the smaller of the two is
 * kept as theirs), or UINT64_MAX when the probe taught nothing;
 * then the next one waits 0.3-1.5 s, twice that after two such probes in a
 * row, and so on up to 1.2-6 s (a neighbour probing at the same moment, or
 * one whose use moves, is not met again at once; a container whose probes
 * keep failing pauses less and less often). A figure keeps the
 * previous one's place; a failure leaves it (it ages out, OTHERS_KEEP_NS).
 * Launches go on from a clean account of what was spent. */
static void probe_end(struct vc_throttle *t, uint64_t now, uint32_t phase, uint64_t fig)
{
    if (phase == 0 || phase == PROBE_ENDING || !atomic_compare_exchange_strong(&t->probe, &phase, PROBE_ENDING))
        return;
    uint64_t next;
    if (fig != UINT64_MAX) {
        probe_learn(t, fig);
        uint64_t first = atomic_load(&t->probe_first);
        atomic_store(&t->others_idle, first < fig ? first : fig); /* the smaller: the safe side */
        atomic_store(&t->others_idle_ns, now);
        atomic_store(&t->probe_fails, 0);
        next = now + jitter(PROBE_RELEARN_NS, PROBE_RELEARN_NS); /* only if the share is still unknown then */
    } else {
        uint32_t n = atomic_load(&t->probe_fails);
        if (n < PROBE_RETRY_STEPS)
            atomic_store(&t->probe_fails, n + 1);
        uint64_t base = PROBE_RETRY_NS << (n < PROBE_RETRY_STEPS ? n : PROBE_RETRY_STEPS);
        next = now + jitter(base, base * 4);
    }
    atomic_store(&t->probe_next_ns, next);
    atomic_store(&t->tokens, 0);
    atomic_store(&t->ctrl_added, atomic_load(&t->added));
    atomic_store(&t->ctrl_tokens, 0);
    atomic_store(&t->ctrl_ok_ns, now);
    atomic_store(&t->throttled, 0);
    atomic_store(&t->probe, 0);
}

/* A probe still holding the container's launches PROBE_ABANDON_NS after it
 * began: the process running it is stopped (SIGSTOP, a debugger) and no
 * other process of the container can step the controller in its place (none
 * has NVML), or it stopped between starting a probe and holding the launches.
 * Whoever waits for tokens ends it (as a probe that taught nothing), and the
 * launches go on at the rate last set: the bucket keeps refilling from the
 * launch accounting while nobody measures. A hold with no probe at all (its
 * starter stopped half-way and the probe was ended meanwhile) is let go too.
 * Called by every waiting launch and by each process's watcher: two loads when
 * no probe runs. */
static void probe_abandon(struct vc_throttle *t, uint64_t now)
{
    uint32_t phase = atomic_load_explicit(&t->probe, memory_order_relaxed);
    if (phase == 0) {
        int64_t cur = atomic_load_explicit(&t->tokens, memory_order_relaxed);
        if (cur < PROBE_HOLD / 2)
            atomic_compare_exchange_strong(&t->tokens, &cur, 0);
        return;
    }
    uint64_t began = atomic_load(&t->probe_ns);
    if (phase == PROBE_ENDING || now < began || now - began < PROBE_ABANDON_NS)
        return;
    VC_DEBUG("a probe has held the launches for %.1f s (its process is stopped?): ended, launches go on",
             (double)(now - began) / 1e9);
    probe_end(t, now, phase, UINT64_MAX);
}

/* The probe of a container sharing a MIG instance with no learned share
 * (started by gpm_shared()): its launches are held (PROBE_DRAIN_NS for what
 * is queued to finish), a GPM baseline is taken, and the next two samples'
 * figures are what the others use. Then the launches go on. Returns 1 while
 * the probe runs (no controller step), 0 when there is none. */
static int probe_step(int s, struct vc_throttle *t, uint64_t now)
{
    uint32_t phase = atomic_load(&t->probe);
    if (phase == 0)
        return 0;
    if (phase == PROBE_ENDING)
        return 1;
    uint64_t began = atomic_load(&t->probe_ns);
    uint64_t fig = 0;
    if (now - began > PROBE_MAX_NS) {
        probe_end(t, now, phase, UINT64_MAX); /* give up: go on as without a probe, try again later */
        return 1;
    }
    if (phase == 1) {
        if (now - began < PROBE_DRAIN_NS)
            return 1;
        gpm[s].prev_ns = 0; /* what this process sampled before includes the container's own work */
        if (gpm_util(s, now, &fig) == 1)
            atomic_compare_exchange_strong(&t->probe, &phase, 2);
        return 1;
    }
    if (held_util(s, now, began, &fig) != 0)
        return 1; /* no figure yet (or this process has no baseline): next step */
    if (phase == 2) {
        atomic_store(&t->probe_first, fig); /* the first figure; a second one must agree */
        atomic_compare_exchange_strong(&t->probe, &phase, 3);
        return 1;
    }
    /* The others' figure must be steady over two samples: a neighbour whose
     * limiter reacts to this pause would make it look larger than their use.
     * It must leave this container its share: others that fill what it leaves
     * while it pauses (they climb on its absence) show what they can take,
     * not what they use beside it. And others idle while their processes are
     * there may be probing at the same moment. None of these is a figure to
     * learn from: again later, at a time of this container's own. */
    uint64_t first = atomic_load(&t->probe_first);
    uint64_t diff = first > fig ? first - fig : fig - first;
    int steady = diff <= 50 && fig >= IDLE_MAX && first <= rest_of_instance() && fig <= rest_of_instance();
    VC_DEBUG("slot %d: the others use %.1f%% then %.1f%% of the MIG instance%s", s, first / 10.0, fig / 10.0,
             steady ? "" : " (not steady: again later)");
    probe_end(t, now, phase, steady ? fig : UINT64_MAX);
    return 1;
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

static void control(int s, struct vc_throttle *t, uint64_t now)
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
    if (last && now - last < gap)
        return;
    if (!atomic_compare_exchange_strong(&t->ctrl_ns, &last, now))
        return; /* another process of the container steps this device */
    if (mode == VC_MEASURE_NONE)
        return;
    if (mode == VC_MEASURE_GPM && probe_step(s, t, now))
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
        set_mode(s, t, mode, VC_MEASURE_DEVICE,
                 "the host PID of a process of the container is unknown, so NVML's per-process utilisation "
                 "cannot be attributed to it");
        mode = VC_MEASURE_DEVICE;
    }
    if (mode == VC_MEASURE_PROCESS) {
        rc = sample(s, t, now, &own, &other);
        if (rc == -2) {
            set_mode(s, t, mode, VC_MEASURE_DEVICE, "NVML does not report per-process utilisation (not supported)");
            mode = VC_MEASURE_DEVICE;
        } else if (rc == 0 && unlisted(s, own, spent)) {
            set_mode(s, t, mode, VC_MEASURE_DEVICE,
                     "NVML lists none of this container's processes on the device while it launches work there "
                     "(its host PIDs are not the ones NVML reports)");
            mode = VC_MEASURE_DEVICE;
        } else if (rc == 0 && blind(t, own, other)) {
            set_mode(s, t, mode, VC_MEASURE_DEVICE,
                     "NVML's per-process utilisation shows none of this container's use while it launches on a "
                     "busy card (its PIDs are not the ones NVML reports)");
            mode = VC_MEASURE_DEVICE;
        }
    }
    if (mode == VC_MEASURE_DEVICE || mode == VC_MEASURE_GPM) {
        rc = sample_device(s, t, now, spent_rate, &own, &other);
        if (rc == -2) {
            set_mode(s, t, mode, VC_MEASURE_NONE,
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
         * neighbour's probe (see probe_step()) and a neighbour's pause or
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
static void overhead(int s)
{
    if (!vc.nvml[s])
        return;
    uint64_t gen = atomic_load(&vc_mem_gen);
    uint64_t own_counted = vc_shm_own_used(vc.shm, s);
    unsigned listed[64];
    unsigned long long mem[64];
    int n = running(s, listed, mem, 64);
    if (n < 0 || atomic_load(&vc_mem_gen) != gen)
        return;
    for (int i = 0; i < n && i < 64; i++) {
        if ((int)listed[i] == vc.host_pid) {
            uint64_t now = mem[i] > own_counted ? mem[i] - own_counted : 0;
            uint64_t confirmed = now < last_overhead[s] ? now : last_overhead[s];
            last_overhead[s] = now;
            vc_shm_set_overhead(vc.shm, s, confirmed);
            return;
        }
    }
}

/* Whether the container can measure device slot s is a matter of which of
 * its processes have NVML, not of the first one to start: a process that can
 * measure takes up a limit given up for lack of NVML, and one that cannot
 * gives it up once no process that can is left (checked every second). */
static void watch_measure(int s, struct vc_throttle *t, int slow)
{
    unsigned mode = atomic_load(&t->mode);
    if (mode == VC_MEASURE_NONE && vc.nvml[s] && atomic_load(&t->none_local)) {
        atomic_store(&t->none_local, 0);
        set_mode(s, t, VC_MEASURE_NONE, VC_MEASURE_PROCESS, "a process of the container that has NVML started");
    } else if (mode != VC_MEASURE_NONE && !vc.nvml[s] && slow && !vc_shm_nvml_anyone(vc.shm, s)) {
        atomic_store(&t->none_local, 1);
        set_mode(s, t, mode, VC_MEASURE_NONE, "no process of the container that has NVML for it is left");
    }
}

static void *watcher(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    uint64_t next_slow = 0;
    for (;;) {
        uint64_t now = now_ns();
        int slow = now >= next_slow;
        if (slow) {
            next_slow = now + SLOW_PERIOD_NS;
            for (int s = 0; s < VC_MAX_DEV; s++)
                if (vc.mem_limit[s] != VC_NO_CAP && vc.mem_limit[s] && vc.nvml[s])
                    overhead(s);
            vc_shm_sweep(vc.shm);
        }
        int limiting = 0;
        for (int s = 0; s < VC_MAX_DEV; s++) {
            struct vc_throttle *t = vc_thr[s];
            if (!t)
                continue;
            limiting = 1;
            watch_measure(s, t, slow);
            if (atomic_load(&t->mode) == VC_MEASURE_NONE) {
                atomic_store(&t->tokens, INT64_MAX / 2); /* not enforced: launches never wait */
                atomic_store(&t->ctrl_ns, now);          /* and still current: no cold restart re-probes it */
                if (atomic_load(&t->mode) != VC_MEASURE_NONE)
                    atomic_store(&t->tokens, 0); /* enforced again meanwhile: no free run */
                continue;
            }
            probe_abandon(t, now);
            refill(t, now);
            if (vc.nvml[s])
                control(s, t, now); /* only processes that can measure step the controller */
        }
        /* Only memory to watch: wake once a second, not every tick (a
         * container of hundreds of idle processes must not keep a core busy). */
        uint64_t after = now_ns();
        uint64_t nap = limiting ? WATCH_TICK_NS : (next_slow > after ? next_slow - after : 0);
        if (nap > SLOW_PERIOD_NS)
            nap = SLOW_PERIOD_NS;
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

void vc_watcher_start(void)
{
    int any = 0;
    for (int s = 0; s < VC_MAX_DEV; s++)
        if (vc_thr[s] || (vc.mem_limit[s] != VC_NO_CAP && vc.mem_limit[s] && vc.nvml[s]))
            any = 1;
    if (!any || atomic_exchange(&watcher_running, 1))
        return;
    pthread_t th;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 256 * 1024);
    if (pthread_create(&th, &a, watcher, NULL) != 0) {
        atomic_store(&watcher_running, 0);
        VC_WARN("cannot start the limiter thread (%s); launches refill the limiter themselves", strerror(errno));
    }
    pthread_attr_destroy(&a);
}
