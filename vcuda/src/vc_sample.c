/* The compute limiter's measurements: what NVML and GPM say a device slot is
 * used for. Per-process SM utilisation split into the container's own and
 * the others' (the container's host PIDs from the shared state), NVML's list
 * of the processes on a device (who runs there, and whether the container's
 * PIDs are the ones NVML reports), the card's utilisation, and a MIG
 * instance's SM utilisation from GPM samples, with the per-device GPM sample
 * buffers (process-local) it owns. In device and GPM modes it also learns
 * what share of the card or instance one cost unit per second takes, and
 * estimates the container's own use from it when others run there; in a MIG
 * instance shared with other containers it starts the probe (vc_probe.c).
 * The controller that uses these figures is in vc_throttle.c. */
#define _GNU_SOURCE
#include "vc_throttle_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vc_hooks.h"
#include "vc_pfn.h"
#include "vc_state.h"

#define NO_SAMPLE_MIN_NS 250000000ull   /* no NVML sample for 2.5 sampling periods (at least 250 ms, */
#define NO_SAMPLE_MAX_NS 2000000000ull  /* at most 2 s; 1 s while the period is unknown) = below NVML's */
#define NO_SAMPLE_UNKNOWN_NS 1000000000ull /* resolution */
#define GPM_MIN_NS 100000000ull         /* GPM: at least 100 ms between two samples (NVML's refresh) */
#define GPM_OLD_NS 2000000000ull        /* a previous GPM sample older than 2 s is a baseline only */
#define OTHERS_KEEP_NS 5000000000ull    /* the others' figure stands for their use this long (share unknown) */

/* A MIG instance as this process's NVML sees it: GPM samples are taken on its
 * card for its GPU instance. Process-local (sample buffers belong to this
 * process's NVML); the controller step goes to whichever process of the
 * container wins it, and each keeps its own previous sample. The two sample
 * buffers are allocated once per device at CUDA start (vc_sample_probe_mig())
 * and kept for the process's life: never freed while the watcher may still
 * sample. */
static struct gpm_dev {
    int mig;                /* the slot's device is a MIG instance */
    nvmlDevice_t parent;    /* its card */
    unsigned int gi;        /* its GPU instance ID */
    nvmlGpmSample_t prev, cur;
    uint64_t prev_ns;       /* when prev was taken, 0 = none */
    uint64_t window_ns;     /* where the last figure's window began */
} gpm[VC_MAX_DEV];

static int unlisted_steps[VC_MAX_DEV]; /* see vc_sample_unlisted() */


/* Is device slot s a MIG instance, and can its card give GPM samples for
 * it? 1 GPM, 0 MIG without GPM, -1 not a MIG instance (or NVML cannot say). */
int vc_sample_probe_mig(int s)
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
int vc_sample_process(int s, struct vc_throttle *t, uint64_t now, uint64_t *own, uint64_t *other)
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
 * listed; cap + 1 when there were more than 64 or than cap (then what was
 * filled, if anything, is not the whole list: NVML may have filled nothing);
 * -1 if NVML cannot say. */
int vc_sample_running(int s, unsigned *pids, unsigned long long *mem, int cap)
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
    int n = vc_sample_running(s, listed, mem, 64);
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
    int n = vc_sample_running(s, listed, mem, 64);
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
 * blind() (vc_throttle.c), this does not depend on the container being held
 * back by the bucket, so a rate that already climbed past the card is caught
 * too. */
int vc_sample_unlisted(int s, uint64_t own, int64_t spent)
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
int vc_sample_gpm(int s, uint64_t now, uint64_t *inst)
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

/* The card's or instance's figure split into the container's own (est, at
 * most the figure) and the others' (the rest). Returns 0 (values set). */
static int split(uint64_t card, double est, uint64_t *own, uint64_t *other)
{
    *own = est < (double)card ? (uint64_t)est : card;
    *other = card - *own;
    return 0;
}

/* GPM mode with processes of other containers in the instance. With a learnt
 * share (what one cost unit per second takes of the instance, learnt alone or
 * by a probe, see probe_end() in vc_probe.c), the container's own use is its launch
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
        vc_probe_check(t, now, card, spent_rate);
        unit = (double)atomic_load(&t->unit_x1e12) / 1e12;
    }
    if (unit <= 0) {
        vc_probe_start(t, now, card, spent_rate);
        if (at && now - at < OTHERS_KEEP_NS) {
            /* The rest of the figure is its own, but never less than the last
             * probe's guess of its share per unit times what it spends: a
             * neighbour's pause (the instance's figure drops) must not make it
             * climb, or that neighbour's probe finds it moving, and a
             * neighbour that yields must not let it run away. */
            double guess = (double)atomic_load(&t->guess_x1e12) / 1e12 * spent_rate * 1000.0;
            double mine = card > idle ? (double)(card - idle) : 0.0;
            /* Its own use follows what it spends: the estimate falls by at
             * most a tenth a step beyond what its spending explains (a
             * neighbour's pause, or one that yields, is not its own use
             * falling), so it drifts to a lower figure over a second rather
             * than climbing at once on a neighbour's pause. */
            uint64_t prev = atomic_load(&t->est_own), prev_rate = atomic_load(&t->est_rate);
            double cont = prev_rate ? (double)prev * spent_rate / (double)prev_rate * 0.9 : 0.0;
            double est = guess > mine ? guess : mine;
            est = cont > est ? cont : est;
            atomic_store(&t->est_own, est < (double)card ? (uint64_t)est : card);
            atomic_store(&t->est_rate, spent_rate > 0 && spent_rate < 1e18 ? (uint64_t)spent_rate : 0);
            return split(card, est, own, other);
        }
    }
    return split(card, unit > 0 && spent_rate > 0 ? unit * spent_rate * 1000.0 : (double)card, own, other);
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
int vc_sample_device(int s, struct vc_throttle *t, uint64_t now, double spent_rate, uint64_t *own, uint64_t *other)
{
    uint64_t card = 0;
    int rc = atomic_load(&t->mode) == VC_MEASURE_GPM ? vc_sample_gpm(s, now, &card) : card_util(s, t, now, &card);
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
    return split(card, unit > 0 && spent_rate > 0 ? unit * spent_rate * 1000.0 : (double)card, own, other);
}

uint64_t vc_sample_gpm_window(int s)
{
    return gpm[s].window_ns;
}

void vc_sample_gpm_forget(int s)
{
    gpm[s].prev_ns = 0;
}

void vc_sample_after_fork(void)
{
    memset(unlisted_steps, 0, sizeof(unlisted_steps));
    for (int s = 0; s < VC_MAX_DEV; s++)
        gpm[s].prev_ns = 0; /* the child's first sample is a baseline */
}
