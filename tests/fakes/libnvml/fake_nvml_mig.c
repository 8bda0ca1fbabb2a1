/* MIG in the fake libnvidia-ml.so.1: included by fake_nvml_node.c (one translation unit: the node state is static).
 *
 * Node file records:
 *   mig <gpu> <family> [<mode 0|1>]   the card is MIG-capable: a100-40 | a100-80 | h100-80 | h200 | a30
 *                                     (Ampere families need a reset to change MIG mode; Hopper ones do not)
 *   migstate <path>                   where the "hardware" keeps MIG mode and instances: read at every call,
 *                                     rewritten (temp file + rename) after every change, so that several
 *                                     processes and a restarted one see the same instances, as on a real card
 *   migpriv 0                         create/destroy/set-mode refused with NO_PERMISSION (an unprivileged agent)
 * Control commands:
 *   reset <gpu>                       a GPU reset: the pending MIG mode becomes current (IN_USE: processes run)
 *   ciproc <gpu> <gi> <ci> <pid>      a process runs on that compute instance (destroying it gives IN_USE)
 *   nociproc <gpu> <gi> <ci> <pid>    it ended
 * Profile enum != profile id (the enum goes into GetGpuInstanceProfileInfo, `info.id` into everything else).
 * Placements count memory slices; a new GI must not overlap a live one (INSUFFICIENT_RESOURCES). Every create
 * draws a new serial, so a re-created instance has a new MIG UUID. */

#define MAX_GI 15
#define MAX_CI 8
#define MAX_PLACE 8
#define MAX_PROFILES 8

enum {
    NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_RESET_REQUIRED = 16, NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
};

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef nvmlGpuInstancePlacement_t nvmlComputeInstancePlacement_t;
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

struct gi;
struct ci;
typedef struct gi *nvmlGpuInstance_t;
typedef struct ci *nvmlComputeInstance_t;
typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

/* One GPU-instance profile of a family. */
struct profile {
    int en;           /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;  /* what `nvidia-smi mig -lgip` shows */
    const char *name; /* without "MIG " */
    unsigned int slices, mem_slices, max, decoders, jpeg, ofa;
    unsigned int starts[MAX_PLACE];
    int nstarts;
};

struct family {
    const char *key;
    int hopper; /* switches MIG mode without a reset */
    unsigned int compute_slices, mem_slices, sm_per_slice;
    struct profile p[MAX_PROFILES];
    int np;
};

#define SEVEN {0, 1, 2, 3, 4, 5, 6}, 7
#define EVEN {0, 2, 4, 6}, 4
#define BIG_FAMILY(KEY, HOP, SM, M1, M2, M3, M7)                                                                   \
    {KEY, HOP, 7, 8, SM, {                                                                                         \
        {0, 19, "1g." M1 "gb", 1, 1, 7, 0, 0, 0, SEVEN},                                                           \
        {7, 20, "1g." M1 "gb+me", 1, 1, 1, 1, 1, 1, SEVEN},                                                        \
        {9, 15, "1g." M2 "gb", 1, 2, 4, 1, 0, 0, EVEN},                                                            \
        {1, 14, "2g." M2 "gb", 2, 2, 3, 1, 0, 0, {0, 2, 4}, 3},                                                    \
        {2, 9, "3g." M3 "gb", 3, 4, 2, 2, 0, 0, {0, 4}, 2},                                                        \
        {3, 5, "4g." M3 "gb", 4, 4, 1, 2, 0, 0, {0}, 1},                                                           \
        {4, 0, "7g." M7 "gb", 7, 8, 1, 5, 1, 1, {0}, 1},                                                           \
    }, 7}

static const struct family FAMILIES[] = {
    BIG_FAMILY("a100-40", 0, 14, "5", "10", "20", "40"),
    BIG_FAMILY("a100-80", 0, 14, "10", "20", "40", "80"),
    BIG_FAMILY("h100-80", 1, 16, "10", "20", "40", "80"),
    BIG_FAMILY("h200", 1, 16, "18", "35", "71", "141"),
    {"a30", 0, 4, 4, 14, {
        {0, 14, "1g.6gb", 1, 1, 4, 0, 0, 0, {0, 1, 2, 3}, 4},
        {7, 21, "1g.6gb+me", 1, 1, 1, 1, 1, 1, {0, 1, 2, 3}, 4},
        {1, 5, "2g.12gb", 2, 2, 2, 2, 0, 0, {0, 2}, 2},
        {8, 6, "2g.12gb+me", 2, 2, 1, 2, 1, 1, {0, 2}, 2},
        {3, 0, "4g.24gb", 4, 4, 1, 4, 1, 1, {0}, 1},
    }, 5},
};
#define NFAMILIES ((int)(sizeof FAMILIES / sizeof FAMILIES[0]))

/* Live state of the instances; the arrays are indexed by id so that handles stay valid across a reload. */
struct ci {
    int live, gpu, gi;
    unsigned int id, prof, start, size;
    unsigned long long serial;
};
struct gi {
    int live, gpu;
    unsigned int id, prof_id, start, size;
    struct ci ci[MAX_CI];
};
struct migcard {
    const struct family *fam;
    int current, pending;
    struct gi gi[MAX_GI];
    int busy[MAX_GI][MAX_CI]; /* processes on each CI (from the control file, not the state file) */
};

static struct {
    struct migcard card[MAX_GPU];
    char state[4096];
    int unprivileged;
    unsigned long long serial;
} M;

static const struct family *family_named(const char *key)
{
    for (int i = 0; i < NFAMILIES; i++)
        if (!strcmp(FAMILIES[i].key, key))
            return &FAMILIES[i];
    return NULL;
}

static const struct profile *profile_by_id(const struct family *f, unsigned int id)
{
    for (int i = 0; f && i < f->np; i++)
        if (f->p[i].id == id)
            return &f->p[i];
    return NULL;
}

static const struct profile *profile_by_enum(const struct family *f, unsigned int en)
{
    for (int i = 0; f && i < f->np; i++)
        if ((unsigned int)f->p[i].en == en)
            return &f->p[i];
    return NULL;
}

static unsigned long long profile_mem_mib(const struct gpu *g, const struct family *f, const struct profile *p)
{
    /* a little under the share of the parent, as real cards report (1g.10gb of an 80 GB card: 9984 MiB) */
    unsigned long long share = g->mem_mib * p->mem_slices / f->mem_slices;
    return share / 256 * 256 - 256;
}

static void mig_reset_state(void)
{
    memset(&M, 0, sizeof M);
    M.unprivileged = 0;
}

/* Spec records; returns 1 when the key was a MIG one. */
static int mig_spec_line(const char *key, const char *rest)
{
    if (!strcmp(key, "mig")) {
        int gi, mode = 0;
        char fam[32] = "";
        if (sscanf(rest, "%d %31s %d", &gi, fam, &mode) >= 2 && gi >= 0 && gi < S.count && family_named(fam)) {
            M.card[gi].fam = family_named(fam);
            M.card[gi].current = M.card[gi].pending = mode ? 1 : 0;
        }
        return 1;
    }
    if (!strcmp(key, "migstate")) {
        copy_str(M.state, sizeof M.state, rest);
        return 1;
    }
    if (!strcmp(key, "migpriv")) {
        M.unprivileged = atoi(rest) == 0;
        return 1;
    }
    return 0;
}

/* The state file: `serial N`, `mode <gpu> <cur> <pend>`, `gi <gpu> <id> <profile id> <start> <size>`,
 * `ci <gpu> <gi> <id> <ci profile> <start> <size> <serial>`. Absent: the modes of the node file, no instance. */
static void mig_load(void)
{
    if (!M.state[0])
        return;
    FILE *f = fopen(M.state, "r");
    if (!f)
        return;
    for (int g = 0; g < S.count; g++)
        for (int i = 0; i < MAX_GI; i++)
            M.card[g].gi[i].live = 0, memset(M.card[g].gi[i].ci, 0, sizeof M.card[g].gi[i].ci);
    char line[LINE_MAX_LEN];
    while (fgets(line, sizeof line, f)) {
        int g, a, b;
        unsigned int id, prof, start, size, gid;
        unsigned long long serial;
        if (sscanf(line, "serial %llu", &serial) == 1) {
            M.serial = serial;
        } else if (sscanf(line, "mode %d %d %d", &g, &a, &b) == 3 && g >= 0 && g < S.count) {
            M.card[g].current = a;
            M.card[g].pending = b;
        } else if (sscanf(line, "gi %d %u %u %u %u", &g, &id, &prof, &start, &size) == 5 && g >= 0 && g < S.count
                   && id < MAX_GI) {
            struct gi *x = &M.card[g].gi[id];
            x->live = 1, x->gpu = g, x->id = id, x->prof_id = prof, x->start = start, x->size = size;
        } else if (sscanf(line, "ci %d %u %u %u %u %u %llu", &g, &gid, &id, &prof, &start, &size, &serial) == 7
                   && g >= 0 && g < S.count && gid < MAX_GI && id < MAX_CI) {
            struct ci *c = &M.card[g].gi[gid].ci[id];
            *c = (struct ci){1, g, (int)gid, id, prof, start, size, serial};
        }
    }
    fclose(f);
}

static void mig_save(void)
{
    if (!M.state[0])
        return;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", M.state, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "serial %llu\n", M.serial);
    for (int g = 0; g < S.count; g++) {
        struct migcard *c = &M.card[g];
        if (!c->fam)
            continue;
        fprintf(f, "mode %d %d %d\n", g, c->current, c->pending);
        for (int i = 0; i < MAX_GI; i++) {
            struct gi *x = &c->gi[i];
            if (!x->live)
                continue;
            fprintf(f, "gi %d %u %u %u %u\n", g, x->id, x->prof_id, x->start, x->size);
            for (int j = 0; j < MAX_CI; j++)
                if (x->ci[j].live)
                    fprintf(f, "ci %d %u %u %u %u %u %llu\n", g, x->id, x->ci[j].id, x->ci[j].prof,
                            x->ci[j].start, x->ci[j].size, x->ci[j].serial);
        }
    }
    fflush(f);
    fsync(fileno(f));
    fclose(f);
    rename(tmp, M.state);
}

static int card_has_instances(int g)
{
    for (int i = 0; i < MAX_GI; i++)
        if (M.card[g].gi[i].live)
            return 1;
    return 0;
}

static int mig_command(const char *cmd, int g, const char *b, const char *c, const char *d)
{
    struct migcard *m = &M.card[g];
    if (!strcmp(cmd, "reset")) {
        if (S.gpus[g].nprocs == 0 && m->fam) {
            m->current = m->pending;
            mig_save();
        }
        return 1;
    }
    if (!strcmp(cmd, "ciproc") || !strcmp(cmd, "nociproc")) {
        unsigned int gi = (unsigned int)atoi(b), ci = (unsigned int)atoi(c);
        (void)d; /* the pid: only the count matters */
        if (gi < MAX_GI && ci < MAX_CI) {
            int *n = &m->busy[gi][ci];
            *n = !strcmp(cmd, "ciproc") ? *n + 1 : (*n > 0 ? *n - 1 : 0);
        }
        return 1;
    }
    return 0;
}

/* -- handles ---------------------------------------------------------------------------------------------------- */
static int is_gpu(nvmlDevice_t d) { return d >= S.gpus && d < S.gpus + S.count; }

/* A MIG device handle is the address of its compute instance; NULL when `d` is none (or a destroyed one). */
static struct ci *as_mig(nvmlDevice_t d)
{
    const char *p = (const char *)(void *)d;
    const char *lo = (const char *)(void *)M.card, *hi = (const char *)(void *)(M.card + S.count);
    if (p < lo || p >= hi)
        return NULL;
    for (int g = 0; g < S.count; g++)
        for (int i = 0; i < MAX_GI; i++)
            for (int j = 0; j < MAX_CI; j++)
                if ((void *)&M.card[g].gi[i].ci[j] == (void *)d)
                    return M.card[g].gi[i].ci[j].live ? &M.card[g].gi[i].ci[j] : NULL;
    return NULL;
}

static struct gi *as_gi(nvmlGpuInstance_t h)
{
    for (int g = 0; g < S.count; g++)
        for (int i = 0; i < MAX_GI; i++)
            if (&M.card[g].gi[i] == h)
                return h->live ? h : NULL;
    return NULL;
}

static struct ci *as_ci(nvmlComputeInstance_t h) { return as_mig((nvmlDevice_t)(void *)h); }

static void mig_uuid(const struct ci *c, char *out, size_t cap)
{
    /* opaque, as since R470; derived from the parent and the create serial, so a re-create gets a new one */
    unsigned long long h = 1469598103934665603ULL;
    for (const char *s = S.gpus[c->gpu].uuid; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    h ^= c->serial * 0x9E3779B97F4A7C15ULL;
    h *= 1099511628211ULL;
    snprintf(out, cap, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", h >> 32, (h >> 16) & 0xFFFF, h & 0xFFFF,
             (c->serial >> 48) & 0xFFFF, c->serial & 0xFFFFFFFFFFFFULL);
}

/* Lock, check init, reload the MIG state, ingest; `gpu` (may be NULL) must be a full GPU. */
static nvmlReturn_t mig_enter(nvmlDevice_t d)
{
    pthread_mutex_lock(&S.mu);
    if (!S.refs) {
        pthread_mutex_unlock(&S.mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    mig_load();
    ingest();
    if (d && !is_gpu(d)) {
        pthread_mutex_unlock(&S.mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (d && d->lost) {
        pthread_mutex_unlock(&S.mu);
        return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

#define MIG_ENTER(d)                                                                                          \
    do {                                                                                                      \
        nvmlReturn_t rc_ = mig_enter(d);                                                                      \
        if (rc_ != NVML_SUCCESS)                                                                              \
            return rc_;                                                                                       \
    } while (0)

static struct migcard *card_of(nvmlDevice_t d) { return &M.card[d - S.gpus]; }

/* -- mode ------------------------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    if (!current || !pending)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!m->fam)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)m->current;
    *pending = (unsigned int)m->pending;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    if (!activation || mode > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!m->fam)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (M.unprivileged)
        return leave(NVML_ERROR_NO_PERMISSION);
    if (mode == 0 && card_has_instances((int)(d - S.gpus)))
        return leave(NVML_ERROR_IN_USE); /* destroy the instances first */
    m->pending = (int)mode;
    if (m->current == (int)mode) {
        *activation = NVML_SUCCESS;
    } else if (d->nprocs) {
        *activation = NVML_ERROR_IN_USE;
    } else if (m->fam->hopper) {
        m->current = (int)mode;
        *activation = NVML_SUCCESS;
    } else {
        *activation = NVML_ERROR_RESET_REQUIRED;
    }
    mig_save();
    return leave(NVML_SUCCESS);
}

/* -- GPU-instance profiles and placements ------------------------------------------------------------------------ */
static void fill_profile(nvmlDevice_t d, const struct profile *p, nvmlGpuInstanceProfileInfo_v2_t *o)
{
    const struct family *f = card_of(d)->fam;
    unsigned int version = o->version;
    memset(o, 0, sizeof *o);
    o->version = version;
    o->id = p->id;
    o->isP2pSupported = 0;
    o->sliceCount = p->slices;
    o->instanceCount = p->max;
    o->multiprocessorCount = p->slices * f->sm_per_slice;
    o->copyEngineCount = p->slices;
    o->decoderCount = p->decoders;
    o->encoderCount = p->en == 4 ? 1 : 0;
    o->jpegCount = p->jpeg;
    o->ofaCount = p->ofa;
    o->memorySizeMB = profile_mem_mib(d, f, p);
    snprintf(o->name, sizeof o->name, "MIG %s", p->name);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int en, nvmlGpuInstanceProfileInfo_t *o)
{
    MIG_ENTER(d);
    const struct family *f = card_of(d)->fam;
    if (!o || en >= 0x12)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const struct profile *p = profile_by_enum(f, en);
    if (!p)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    nvmlGpuInstanceProfileInfo_v2_t v2 = {0};
    fill_profile(d, p, &v2);
    memcpy(o, &v2.id, sizeof *o);
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t profile_v2(nvmlDevice_t d, const struct profile *p, nvmlGpuInstanceProfileInfo_v2_t *o)
{
    if (o->version != (unsigned int)(sizeof *o | 2u << 24))
        return NVML_ERROR_INVALID_ARGUMENT; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH in newer drivers */
    fill_profile(d, p, o);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int en,
                                                      nvmlGpuInstanceProfileInfo_v2_t *o)
{
    MIG_ENTER(d);
    if (!o || en >= 0x12)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const struct profile *p = profile_by_enum(card_of(d)->fam, en);
    return leave(p ? profile_v2(d, p, o) : NVML_ERROR_NOT_SUPPORTED);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t d, unsigned int id,
                                                          nvmlGpuInstanceProfileInfo_v2_t *o)
{
    MIG_ENTER(d);
    if (!o)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const struct family *f = card_of(d)->fam;
    const struct profile *p = profile_by_id(f, id);
    return leave(!f ? NVML_ERROR_NOT_SUPPORTED : p ? profile_v2(d, p, o) : NVML_ERROR_INVALID_ARGUMENT);
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int id,
                                                              nvmlGpuInstancePlacement_t *out, unsigned int *count)
{
    MIG_ENTER(d);
    const struct family *f = card_of(d)->fam;
    if (!f)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    const struct profile *p = profile_by_id(f, id);
    if (!p || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!out) { /* a count probe */
        *count = (unsigned int)p->nstarts;
        return leave(NVML_SUCCESS);
    }
    if (*count < (unsigned int)p->nstarts) {
        *count = (unsigned int)p->nstarts;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (int i = 0; i < p->nstarts; i++)
        out[i] = (nvmlGpuInstancePlacement_t){p->starts[i], p->mem_slices};
    *count = (unsigned int)p->nstarts;
    return leave(NVML_SUCCESS);
}

/* Why `p` cannot be placed at `start` now (0: it can). */
static nvmlReturn_t placement_problem(int g, const struct profile *p, unsigned int start)
{
    struct migcard *m = &M.card[g];
    int ok = 0;
    for (int i = 0; i < p->nstarts; i++)
        ok |= p->starts[i] == start;
    if (!ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int same = 0, compute = 0;
    for (int i = 0; i < MAX_GI; i++) {
        struct gi *x = &m->gi[i];
        if (!x->live)
            continue;
        const struct profile *q = profile_by_id(m->fam, x->prof_id);
        same += x->prof_id == p->id;
        compute += q ? q->slices : 0;
        if (start < x->start + x->size && x->start < start + p->mem_slices)
            return NVML_ERROR_INSUFFICIENT_RESOURCES; /* overlaps a live instance */
    }
    if (same >= p->max || compute + p->slices > m->fam->compute_slices)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned int id, unsigned int *count)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    const struct profile *p = profile_by_id(m->fam, id);
    if (!m->fam)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!p || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* how many more fit: place greedily on a scratch copy */
    struct gi saved[MAX_GI];
    memcpy(saved, m->gi, sizeof saved);
    unsigned int n = 0;
    for (int i = 0; m->current && i < p->nstarts; i++) {
        if (placement_problem((int)(d - S.gpus), p, p->starts[i]) != NVML_SUCCESS)
            continue;
        for (int k = 0; k < MAX_GI; k++)
            if (!m->gi[k].live) {
                m->gi[k] = (struct gi){.live = 1, .id = (unsigned int)k, .prof_id = p->id, .start = p->starts[i],
                                       .size = p->mem_slices};
                break;
            }
        n++;
    }
    memcpy(m->gi, saved, sizeof saved);
    *count = n;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t create_gi(nvmlDevice_t d, unsigned int id, const nvmlGpuInstancePlacement_t *where,
                              nvmlGpuInstance_t *out)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    int g = (int)(d - S.gpus);
    if (!m->fam || !m->current)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* MIG mode is off */
    const struct profile *p = profile_by_id(m->fam, id);
    if (!p || !out || (where && where->size != p->mem_slices))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (M.unprivileged)
        return leave(NVML_ERROR_NO_PERMISSION);
    int start = -1;
    nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (where) {
        rc = placement_problem(g, p, where->start);
        start = rc == NVML_SUCCESS ? (int)where->start : -1;
    } else {
        for (int i = 0; i < p->nstarts && start < 0; i++)
            if (placement_problem(g, p, p->starts[i]) == NVML_SUCCESS)
                start = (int)p->starts[i], rc = NVML_SUCCESS;
    }
    if (rc != NVML_SUCCESS)
        return leave(rc);
    int slot = -1;
    for (int k = 1; k < MAX_GI && slot < 0; k++) /* GI ids from 1; a full-card 7g takes 0 */
        if (!m->gi[k].live)
            slot = k;
    if (p->slices == m->fam->compute_slices && !m->gi[0].live)
        slot = 0;
    if (slot < 0)
        return leave(NVML_ERROR_INSUFFICIENT_RESOURCES);
    struct gi *x = &m->gi[slot];
    memset(x, 0, sizeof *x);
    *x = (struct gi){.live = 1, .gpu = g, .id = (unsigned int)slot, .prof_id = p->id, .start = (unsigned int)start,
                     .size = p->mem_slices};
    mig_save();
    *out = x;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out)
{
    return create_gi(d, id, NULL, out);
}

API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int id,
                                                         const nvmlGpuInstancePlacement_t *where,
                                                         nvmlGpuInstance_t *out)
{
    if (!where)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, id, where, out);
}

API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t h)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    if (!x)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* a stale or foreign handle */
    if (M.unprivileged)
        return leave(NVML_ERROR_NO_PERMISSION);
    for (int j = 0; j < MAX_CI; j++)
        if (x->ci[j].live)
            return leave(NVML_ERROR_IN_USE); /* its compute instances first */
    x->live = 0;
    mig_save();
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out,
                                           unsigned int *count)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    if (!m->fam)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!profile_by_id(m->fam, id) || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int i = 0; i < MAX_GI; i++) {
        if (!m->gi[i].live || m->gi[i].prof_id != id)
            continue;
        if (out && n >= *count)
            return leave(NVML_ERROR_INSUFFICIENT_SIZE);
        if (out)
            out[n] = &m->gi[i];
        n++;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    if (!m->fam || !m->current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!out || id >= MAX_GI)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!m->gi[id].live)
        return leave(NVML_ERROR_NOT_FOUND);
    *out = &m->gi[id];
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t h, nvmlGpuInstanceInfo_t *info)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    if (!x || !info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *info = (nvmlGpuInstanceInfo_t){&S.gpus[x->gpu], x->id, x->prof_id, {x->start, x->size}};
    return leave(NVML_SUCCESS);
}

/* -- compute instances ------------------------------------------------------------------------------------------ */
static const unsigned int CI_SLICES[] = {1, 2, 3, 4, 7, 8, 6}; /* NVML_COMPUTE_INSTANCE_PROFILE_* -> slices */

static nvmlReturn_t ci_profile(const struct gi *x, unsigned int en, unsigned int *slices)
{
    const struct profile *p = profile_by_id(M.card[x->gpu].fam, x->prof_id);
    if (en >= 9)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (en >= 7 || !p || CI_SLICES[en] > p->slices)
        return NVML_ERROR_NOT_SUPPORTED;
    *slices = CI_SLICES[en];
    return NVML_SUCCESS;
}

static nvmlReturn_t fill_ci_profile(const struct gi *x, unsigned int en, nvmlComputeInstanceProfileInfo_v2_t *o)
{
    unsigned int slices = 0;
    nvmlReturn_t rc = ci_profile(x, en, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct migcard *m = &M.card[x->gpu];
    const struct profile *p = profile_by_id(m->fam, x->prof_id);
    unsigned int version = o->version;
    memset(o, 0, sizeof *o);
    o->version = version;
    o->id = en;
    o->sliceCount = slices;
    o->instanceCount = p->slices / slices;
    o->multiprocessorCount = slices * m->fam->sm_per_slice;
    o->sharedCopyEngineCount = p->slices;
    o->sharedDecoderCount = p->decoders;
    o->sharedJpegCount = p->jpeg;
    o->sharedOfaCount = p->ofa;
    if (slices == p->slices)
        snprintf(o->name, sizeof o->name, "MIG %s", p->name);
    else
        snprintf(o->name, sizeof o->name, "MIG %uc.%s", slices, p->name);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t h, unsigned int en,
                                                             unsigned int eng, nvmlComputeInstanceProfileInfo_t *o)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    if (!x || !o || eng != 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlComputeInstanceProfileInfo_v2_t v2 = {0};
    nvmlReturn_t rc = fill_ci_profile(x, en, &v2);
    if (rc == NVML_SUCCESS)
        memcpy(o, &v2.id, sizeof *o);
    return leave(rc);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t h, unsigned int en,
                                                              unsigned int eng,
                                                              nvmlComputeInstanceProfileInfo_v2_t *o)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    if (!x || !o || eng != 0 || o->version != (unsigned int)(sizeof *o | 2u << 24))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(fill_ci_profile(x, en, o));
}

static unsigned int ci_used(const struct gi *x)
{
    unsigned int used = 0;
    for (int j = 0; j < MAX_CI; j++)
        used += x->ci[j].live ? x->ci[j].size : 0;
    return used;
}

static int ci_fits(const struct gi *x, unsigned int start, unsigned int size)
{
    const struct profile *p = profile_by_id(M.card[x->gpu].fam, x->prof_id);
    if (start % size || start + size > p->slices)
        return 0;
    for (int j = 0; j < MAX_CI; j++)
        if (x->ci[j].live && start < x->ci[j].start + x->ci[j].size && x->ci[j].start < start + size)
            return 0;
    return 1;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t h, unsigned int en,
                                                                   unsigned int *count)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    unsigned int slices = 0;
    if (!x || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = ci_profile(x, en, &slices);
    if (rc == NVML_SUCCESS) {
        const struct profile *p = profile_by_id(M.card[x->gpu].fam, x->prof_id);
        *count = (p->slices - ci_used(x)) / slices;
    }
    return leave(rc);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t h, unsigned int en,
                                                                    nvmlComputeInstancePlacement_t *out,
                                                                    unsigned int *count)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    unsigned int slices = 0;
    if (!x || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = ci_profile(x, en, &slices);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    const struct profile *p = profile_by_id(M.card[x->gpu].fam, x->prof_id);
    unsigned int n = p->slices / slices;
    if (out && *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; out && i < n; i++)
        out[i] = (nvmlComputeInstancePlacement_t){i * slices, slices};
    *count = n;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t h, unsigned int en, const nvmlComputeInstancePlacement_t *where,
                              nvmlComputeInstance_t *out)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    unsigned int slices = 0;
    if (!x || !out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = ci_profile(x, en, &slices);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    if (M.unprivileged)
        return leave(NVML_ERROR_NO_PERMISSION);
    const struct profile *p = profile_by_id(M.card[x->gpu].fam, x->prof_id);
    int start = -1;
    if (where) {
        if (where->size != slices || where->start % slices || where->start + slices > p->slices)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        start = ci_fits(x, where->start, slices) ? (int)where->start : -1;
    } else {
        for (unsigned int s = 0; s + slices <= p->slices && start < 0; s += slices)
            if (ci_fits(x, s, slices))
                start = (int)s;
    }
    int slot = -1;
    for (int j = 0; j < MAX_CI && slot < 0; j++)
        if (!x->ci[j].live)
            slot = j;
    if (start < 0 || slot < 0)
        return leave(NVML_ERROR_INSUFFICIENT_RESOURCES);
    x->ci[slot] = (struct ci){1, x->gpu, (int)x->id, (unsigned int)slot, en, (unsigned int)start, slices, ++M.serial};
    M.card[x->gpu].busy[x->id][slot] = 0;
    mig_save();
    *out = &x->ci[slot];
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t h, unsigned int en, nvmlComputeInstance_t *out)
{
    return create_ci(h, en, NULL, out);
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t h, unsigned int en,
                                                                  const nvmlComputeInstancePlacement_t *where,
                                                                  nvmlComputeInstance_t *out)
{
    if (!where)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(h, en, where, out);
}

API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t h)
{
    MIG_ENTER(NULL);
    struct ci *c = as_ci(h);
    if (!c)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (M.unprivileged)
        return leave(NVML_ERROR_NO_PERMISSION);
    if (M.card[c->gpu].busy[c->gi][c->id])
        return leave(NVML_ERROR_IN_USE); /* a process still runs on it */
    c->live = 0;
    mig_save();
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t h, unsigned int en, nvmlComputeInstance_t *out,
                                                    unsigned int *count)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    if (!x || !count || en >= 9)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int j = 0; j < MAX_CI; j++) {
        if (!x->ci[j].live || x->ci[j].prof != en)
            continue;
        if (out && n >= *count)
            return leave(NVML_ERROR_INSUFFICIENT_SIZE);
        if (out)
            out[n] = &x->ci[j];
        n++;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t h, unsigned int id,
                                                       nvmlComputeInstance_t *out)
{
    MIG_ENTER(NULL);
    struct gi *x = as_gi(h);
    if (!x || !out || id >= MAX_CI)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!x->ci[id].live)
        return leave(NVML_ERROR_NOT_FOUND);
    *out = &x->ci[id];
    return leave(NVML_SUCCESS);
}

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_v2_t;

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_v2_t *info)
{
    MIG_ENTER(NULL);
    struct ci *c = as_ci(h);
    if (!c || !info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* `device` is the MIG device handle of this compute instance (what the DRA driver reads the UUID from) */
    *info = (nvmlComputeInstanceInfo_v2_t){(nvmlDevice_t)(void *)c, &M.card[c->gpu].gi[c->gi], c->id, c->prof,
                                           {c->start, c->size}};
    return leave(NVML_SUCCESS);
}

/* -- MIG device handles ----------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig)
{
    MIG_ENTER(NULL);
    if (!is_mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct ci *c = as_mig(d);
    if (!c && !is_gpu(d))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = c != NULL;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    MIG_ENTER(NULL);
    struct ci *c = as_mig(d);
    if (!id || (!c && !is_gpu(d)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* a full GPU */
    *id = (unsigned int)c->gi;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
    MIG_ENTER(NULL);
    struct ci *c = as_mig(d);
    if (!id || (!c && !is_gpu(d)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = c->id;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = m->fam && m->current ? m->fam->compute_slices : 0;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out)
{
    MIG_ENTER(d);
    struct migcard *m = card_of(d);
    if (!out || !m->fam || !m->current || index >= m->fam->compute_slices)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int k = 0;
    for (int i = 0; i < MAX_GI; i++)
        for (int j = 0; j < MAX_CI; j++)
            if (m->gi[i].live && m->gi[i].ci[j].live && k++ == index) {
                *out = (nvmlDevice_t)(void *)&m->gi[i].ci[j];
                return leave(NVML_SUCCESS);
            }
    return leave(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent)
{
    MIG_ENTER(NULL);
    struct ci *c = as_mig(d);
    if (!c || !parent)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *parent = &S.gpus[c->gpu];
    return leave(NVML_SUCCESS);
}

static unsigned long long ci_mem_mib(const struct ci *c)
{
    const struct migcard *m = &M.card[c->gpu];
    return profile_mem_mib(&S.gpus[c->gpu], m->fam, profile_by_id(m->fam, m->gi[c->gi].prof_id));
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    MIG_ENTER(NULL);
    struct ci *c = as_mig(d);
    if (!a || (!c && !is_gpu(d)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    const struct migcard *m = &M.card[c->gpu];
    const struct profile *p = profile_by_id(m->fam, m->gi[c->gi].prof_id);
    *a = (nvmlDeviceAttributes_t){c->size * m->fam->sm_per_slice, p->slices, p->decoders, p->en == 4, p->jpeg,
                                  p->ofa, p->slices, c->size, ci_mem_mib(c)};
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *out)
{
    MIG_ENTER(NULL);
    if (!uuid || !out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int g = 0; g < S.count; g++) {
        if (!strcmp(S.gpus[g].uuid, uuid)) {
            *out = &S.gpus[g];
            return leave(NVML_SUCCESS);
        }
        for (int i = 0; i < MAX_GI; i++)
            for (int j = 0; j < MAX_CI; j++) {
                struct ci *c = &M.card[g].gi[i].ci[j];
                char u[96];
                if (!M.card[g].gi[i].live || !c->live)
                    continue;
                mig_uuid(c, u, sizeof u);
                if (!strcmp(u, uuid)) {
                    *out = (nvmlDevice_t)(void *)c;
                    return leave(NVML_SUCCESS);
                }
            }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long last, int *vtype,
                                      unsigned int *count, void *samples)
{
    (void)type, (void)last, (void)samples;
    MIG_ENTER(NULL);
    if (!vtype || !count || (!as_mig(d) && !is_gpu(d)))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (as_mig(d) || card_of(d)->current)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* no utilisation samples in MIG mode */
    return leave(NVML_ERROR_NOT_FOUND);
}

/* For the calls of fake_nvml_node.c that also take MIG handles: NVML_SUCCESS and *mig set (S.mu held) when `d` is
 * a live MIG handle; NOT_FOUND when it is none (the caller goes on as for a full GPU). */
static nvmlReturn_t mig_handle(nvmlDevice_t d, struct ci **mig)
{
    pthread_mutex_lock(&S.mu);
    *mig = NULL;
    if (!S.refs || is_gpu(d)) {
        pthread_mutex_unlock(&S.mu);
        return NVML_ERROR_NOT_FOUND;
    }
    mig_load();
    ingest();
    *mig = as_mig(d);
    if (!*mig) {
        pthread_mutex_unlock(&S.mu);
        return NVML_ERROR_NOT_FOUND;
    }
    return NVML_SUCCESS;
}

/* Is the full GPU `d` in MIG mode (S.mu held)? */
static int in_mig_mode(nvmlDevice_t d) { return is_gpu(d) && M.card[d - S.gpus].current; }

static const char *mig_name(const struct ci *c)
{
    static __thread char name[200];
    const struct migcard *m = &M.card[c->gpu];
    snprintf(name, sizeof name, "%s MIG %s", S.gpus[c->gpu].name, profile_by_id(m->fam, m->gi[c->gi].prof_id)->name);
    return name;
}

static unsigned int mig_minor(const struct ci *c) { return S.gpus[c->gpu].minor; }
