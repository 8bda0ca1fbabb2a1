/* GPM (GPU performance monitoring) in the fake libnvidia-ml.so.1: included by fake_nvml_node.c after
 * fake_nvml_mig.c (one translation unit: the node state is static).
 *
 * Node file records:
 *   arch <gpu> <ampere|hopper|blackwell|...|number>   the card's architecture (nvmlDeviceArchitecture_t); without
 *                                                     it, from the MIG family (h100-80, h200: Hopper; a100-*, a30:
 *                                                     Ampere) or the name (H100, H200, GH200: Hopper; B200:
 *                                                     Blackwell; A100, A30, A10: Ampere; ...)
 * Control commands:
 *   gpmload <gpu> <gi|-> <sm %>    from now on, that GPU instance (or, with "-", the whole card) keeps <sm %> of its
 *                                  SMs busy; GPM's counters integrate it over time
 *
 * GPM is supported on Hopper and later: nvmlGpmQueryDeviceSupport says isSupportedDevice 1 there, 0 on Ampere and
 * older, where nvmlGpmSampleGet / nvmlGpmMigSampleGet answer NOT_SUPPORTED. Per-instance samples go through the
 * card (nvmlGpmMigSampleGet(card, GI ID)); a MIG device handle takes no GPM sample of its own (NOT_SUPPORTED).
 * nvmlGpmMetricsGet computes SM utilisation (and graphics utilisation, SM occupancy: the same figure here) from two
 * samples of the same card or instance; other metric IDs come back with their nvmlReturn NOT_SUPPORTED. */

#define ARCH_AMPERE 7
#define ARCH_HOPPER 9
#define ARCH_UNKNOWN 0xffffffffU
#define GPM_METRIC_GRAPHICS_UTIL 1
#define GPM_METRIC_SM_UTIL 2
#define GPM_METRIC_SM_OCCUPANCY 3
#define GPM_METRIC_MAX 477 /* the NVML 13 header's array size */
#define GPM_METRICS_GET_VERSION 1
#define GPM_SUPPORT_VERSION 1
#define GPM_MAGIC 0x47504d53U
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

typedef struct gpm_sample *nvmlGpmSample_t;
typedef struct {
    char *shortName, *longName, *unit;
} nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
typedef struct {
    unsigned int version, isSupportedDevice;
} nvmlGpmSupport_t;

/* One SM-load integrator: load (percent) since `since` (us), and percent-microseconds accumulated before it. */
struct gpm_acc {
    unsigned int load;
    unsigned long long since, acc;
};

struct gpm_sample {
    unsigned int magic;
    int filled, gpu;
    unsigned int gi; /* ~0: the whole card */
    unsigned long long at, acc;
};

static struct {
    unsigned int arch[MAX_GPU]; /* 0: not given */
    struct gpm_acc card[MAX_GPU];
    struct gpm_acc inst[MAX_GPU][MAX_GI];
} G;

static void gpm_reset_state(void) { memset(&G, 0, sizeof G); }

static unsigned int arch_named(const char *s)
{
    static const char *names[] = {"", "", "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada",
                                  "hopper", "blackwell"};
    for (unsigned int i = 2; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i]))
            return i;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    return *end == 0 && v > 0 && v < 64 ? (unsigned int)v : 0;
}

/* Spec records; returns 1 when the key was a GPM one. */
static int gpm_spec_line(const char *key, const char *rest)
{
    if (strcmp(key, "arch"))
        return 0;
    int g;
    char name[32] = "";
    if (sscanf(rest, "%d %31s", &g, name) == 2 && g >= 0 && g < S.count)
        G.arch[g] = arch_named(name);
    return 1;
}

static unsigned int arch_of(int g)
{
    if (G.arch[g])
        return G.arch[g];
    if (M.card[g].fam)
        return M.card[g].fam->hopper ? ARCH_HOPPER : ARCH_AMPERE;
    const char *n = S.gpus[g].name;
    static const struct { const char *part; unsigned int arch; } by_name[] = {
        {"GH200", 9}, {"H100", 9}, {"H200", 9}, {"H800", 9}, {"H20", 9}, {"B200", 10}, {"B100", 10}, {"GB200", 10},
        {"A100", 7}, {"A800", 7}, {"A30", 7}, {"A40", 7}, {"A10", 7}, {"A16", 7}, {"L40", 8}, {"L4", 8},
        {"V100", 5}, {"T4", 6}, {"P100", 4},
    };
    for (size_t i = 0; i < sizeof by_name / sizeof by_name[0]; i++)
        if (strstr(n, by_name[i].part))
            return by_name[i].arch;
    return ARCH_UNKNOWN;
}

static int gpm_capable(int g)
{
    unsigned int a = arch_of(g);
    return a != ARCH_UNKNOWN && a >= ARCH_HOPPER;
}

static unsigned long long acc_now(const struct gpm_acc *x, unsigned long long now)
{
    return x->acc + (unsigned long long)x->load * (now > x->since ? now - x->since : 0);
}

/* Control commands; returns 1 when the command was a GPM one. Called with S.mu held. */
static int gpm_command(const char *cmd, int g, const char *b, const char *c)
{
    if (strcmp(cmd, "gpmload"))
        return 0;
    char *end;
    long pct = strtol(c, &end, 10);
    if (*end || pct < 0 || pct > 100)
        return 1;
    struct gpm_acc *x = NULL;
    if (!strcmp(b, "-")) {
        x = &G.card[g];
    } else {
        long gi = strtol(b, &end, 10);
        if (*end || gi < 0 || gi >= MAX_GI)
            return 1;
        x = &G.inst[g][gi];
    }
    unsigned long long now = now_us();
    x->acc = acc_now(x, now);
    x->since = now;
    x->load = (unsigned int)pct;
    return 1;
}

/* The card a handle stands for (a MIG handle: its parent), -1 when it is no live handle. Called with S.mu held. */
static int gpm_card(nvmlDevice_t d)
{
    if (is_gpu(d))
        return (int)(d - S.gpus);
    struct ci *c = as_mig(d);
    return c ? c->gpu : -1;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
    MIG_ENTER(NULL);
    int g = gpm_card(d);
    if (g < 0 || !arch)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *arch = arch_of(g);
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *sup)
{
    MIG_ENTER(NULL);
    int g = gpm_card(d);
    if (g < 0 || !sup)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (sup->version != GPM_SUPPORT_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    sup->isSupportedDevice = gpm_capable(g) ? 1U : 0U;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out)
{
    MIG_ENTER(NULL);
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct gpm_sample *s = calloc(1, sizeof *s);
    if (!s)
        return leave(NVML_ERROR_UNKNOWN);
    s->magic = GPM_MAGIC;
    *out = s;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s)
{
    MIG_ENTER(NULL);
    if (!s || s->magic != GPM_MAGIC)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    s->magic = 0;
    free(s);
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s)
{
    MIG_ENTER(NULL);
    int g = gpm_card(d);
    if (g < 0 || !s || s->magic != GPM_MAGIC)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_capable(g) || !is_gpu(d))
        return leave(NVML_ERROR_NOT_SUPPORTED); /* no GPM before Hopper; per-instance samples go through the card */
    if (S.gpus[g].lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    unsigned long long now = now_us();
    *s = (struct gpm_sample){GPM_MAGIC, 1, g, ~0U, now, acc_now(&G.card[g], now)};
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gi, nvmlGpmSample_t s)
{
    MIG_ENTER(NULL);
    if (!is_gpu(d) || !s || s->magic != GPM_MAGIC)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int g = (int)(d - S.gpus);
    if (!gpm_capable(g))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (S.gpus[g].lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    if (!M.card[g].current)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* not in MIG mode: no GPU instances */
    if (gi >= MAX_GI || !M.card[g].gi[gi].live)
        return leave(NVML_ERROR_NOT_FOUND);
    unsigned long long now = now_us();
    *s = (struct gpm_sample){GPM_MAGIC, 1, g, gi, now, acc_now(&G.inst[g][gi], now)};
    return leave(NVML_SUCCESS);
}

static char gpm_sm_short[] = "sm_util", gpm_sm_long[] = "SM utilization", gpm_gr_short[] = "gr_util",
            gpm_gr_long[] = "graphics utilization", gpm_occ_short[] = "sm_occupancy",
            gpm_occ_long[] = "SM occupancy", gpm_pct[] = "%";

API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m)
{
    MIG_ENTER(NULL);
    if (!m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (m->version != GPM_METRICS_GET_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    struct gpm_sample *a = m->sample1, *b = m->sample2;
    if (!a || !b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC || !a->filled || !b->filled ||
        m->numMetrics == 0 || m->numMetrics > GPM_METRIC_MAX)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (a->gpu != b->gpu || a->gi != b->gi)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* samples of two different cards or instances */
    unsigned long long t0 = a->at < b->at ? a->at : b->at, t1 = a->at < b->at ? b->at : a->at;
    unsigned long long c0 = a->at < b->at ? a->acc : b->acc, c1 = a->at < b->at ? b->acc : a->acc;
    double util = t1 > t0 ? (double)(c1 - c0) / (double)(t1 - t0) : 0.0;
    for (unsigned int k = 0; k < m->numMetrics; k++) {
        nvmlGpmMetric_t *x = &m->metrics[k];
        x->value = 0.0;
        x->metricInfo = (nvmlGpmMetricInfo_t){NULL, NULL, NULL};
        x->nvmlReturn = NVML_SUCCESS;
        if (x->metricId == GPM_METRIC_SM_UTIL)
            x->metricInfo = (nvmlGpmMetricInfo_t){gpm_sm_short, gpm_sm_long, gpm_pct};
        else if (x->metricId == GPM_METRIC_GRAPHICS_UTIL)
            x->metricInfo = (nvmlGpmMetricInfo_t){gpm_gr_short, gpm_gr_long, gpm_pct};
        else if (x->metricId == GPM_METRIC_SM_OCCUPANCY)
            x->metricInfo = (nvmlGpmMetricInfo_t){gpm_occ_short, gpm_occ_long, gpm_pct};
        else
            x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; /* counters the fake does not model */
        if (x->nvmlReturn == NVML_SUCCESS)
            x->value = util > 100.0 ? 100.0 : util;
    }
    return leave(NVML_SUCCESS);
}
