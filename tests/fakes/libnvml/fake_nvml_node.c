/* A fake libnvidia-ml.so.1 that simulates a whole GPU node, for testing gpumgr's NVML backend through the
 * real nvidia-ml-py binding. Struct layouts and entry point names are those of NVML's public nvml.h.
 *
 * The node comes from a text file named by $FAKE_NVML_NODE, read at nvmlInit (written by
 * gpumgr/devices/fake_nvml_node.py). One record a line:
 *   driver <version>                cuda <int, e.g. 12040>           init_error <nvmlReturn_t>
 *   control <path>                  file the test appends commands to (below)
 *   gpu <uuid> <minor> <bus id> <memory MiB> <pci device id hex> <name...>
 *   nvlinks <gpu> <link count>      anc <gpu a> <gpu b> <nvmlGpuTopologyLevel_t>
 *   link <gpu> <link> <gpu|switch|npu> <remote bus id> <remote pci device id hex>
 *   memaff <gpu> <NUMA node>
 *   noecc <gpu>                     the card has ECC off (or none): no ECC counters, no double-bit ECC events
 *                                   (registering for them is refused with NOT_SUPPORTED, as NVML does)
 * Control commands, applied in order as the library next looks (every call reads what was appended):
 *   xid <gpu> <code> [<gi> <ci>] (on one MIG instance)     dbe <gpu> (double-bit ECC event, +1 volatile uncorrected)    ecc <gpu> <count>
 *   temp <gpu> <C>       lost <gpu>      back <gpu>      proc <gpu> <pid> <bytes> <sm %>   noproc <gpu> <pid>
 *   (a process's <bytes> may be 18446744073709551615, NVML's "value not available", as old drivers report)
 * MIG records and commands: fake_nvml_mig.c; GPM (architecture, per-instance SM load): fake_nvml_gpm.c.
 * A control line of LINE_MAX_LEN - 1 characters or more (before its newline) is skipped whole.
 *
 * Older drivers lack newer entry points; build with -DNO_PROCS_V3, -DNO_PROCS_V2, -DNO_WAIT_V2,
 * -DNO_REMOTE_TYPE, -DNO_SUPPORTED_EVENTS to leave them out (see the Makefile's variants). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)

#define MAX_GPU 64
#define MAX_LINK 36
#define MAX_PROC 32
#define MAX_EVENTS 256
#define LINE_MAX_LEN 512

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct { /* what _v3 filled in drivers 535.43 to 535.86 (a layout change without a version bump) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_v3_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

struct gpu;
typedef struct gpu *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
} nvmlEventData_v1_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct eventset;
typedef struct eventset *nvmlEventSet_t;

/* MIG (fake_nvml_mig.c, included at the end) */
struct ci;
static void mig_reset_state(void);
static int mig_spec_line(const char *key, const char *rest);
static int mig_command(const char *cmd, int g, const char *b, const char *c, const char *d);
static void mig_load(void);
static nvmlReturn_t mig_handle(nvmlDevice_t d, struct ci **mig);
static int in_mig_mode(nvmlDevice_t d);
static void mig_uuid(const struct ci *c, char *out, size_t cap);
static unsigned long long ci_mem_mib(const struct ci *c);
static const char *mig_name(const struct ci *c);
static unsigned int mig_minor(const struct ci *c);
/* GPM (fake_nvml_gpm.c, included at the end) */
static void gpm_reset_state(void);
static int gpm_spec_line(const char *key, const char *rest);
static int gpm_command(const char *cmd, int g, const char *b, const char *c);

enum { EV_DBE = 0x2, EV_XID = 0x8 };
enum { LINK_NONE = 0, LINK_GPU, LINK_SWITCH, LINK_NPU };

struct link {
    int kind;
    char remote_bus[32];
    unsigned int remote_devid;
};

struct proc {
    unsigned int pid;
    unsigned long long mem, ts;
    unsigned int sm;
};

struct gpu {
    int present;
    char uuid[96], name[96], bus[32];
    unsigned int minor, devid;
    unsigned long long mem_mib;
    int nlinks, memaff, temp, lost, noecc;
    unsigned long long ecc_uncorrected;
    struct link links[MAX_LINK];
    struct proc procs[MAX_PROC];
    int nprocs;
    unsigned long long mask; /* registered event types */
};

struct event {
    int gpu;
    unsigned long long type, data;
    unsigned int gi, ci; /* the MIG instance the event names (~0: the whole card) */
};

struct eventset {
    int used;
};

static struct {
    pthread_mutex_t mu;
    int refs;
    int count;
    struct gpu gpus[MAX_GPU];
    int anc[MAX_GPU][MAX_GPU];
    char driver[80];
    int cuda;
    int v3_layout; /* _v3 fills nvmlProcessInfo_v3_t, as 535.43 to 535.86 did */
    char control[4096];
    char loaded[4096]; /* the node file the state came from */
    long control_off;
    struct event q[MAX_EVENTS];
    int qhead, qlen;
    int lost_pending;
    struct eventset set;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static unsigned long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static int gpu_arg(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*end == 0 && v >= 0 && v < S.count) ? (int)v : -1;
}

static void push_event_on(int g, unsigned long long type, unsigned long long data, unsigned int gi, unsigned int ci)
{
    if (!(S.gpus[g].mask & type))
        return; /* as NVML: only cards registered for this kind of event when it happens get it */
    if (S.qlen == MAX_EVENTS)
        return; /* full: the oldest stay, as a bounded driver queue would drop */
    S.q[(S.qhead + S.qlen) % MAX_EVENTS] = (struct event){g, type, data, gi, ci};
    S.qlen++;
}

static void push_event(int g, unsigned long long type, unsigned long long data)
{
    push_event_on(g, type, data, ~0U, ~0U);
}

static void apply_command(char *line)
{
    char cmd[16] = "";
    char a[32] = "", b[32] = "", c[32] = "", d[32] = "";
    if (sscanf(line, "%15s %31s %31s %31s %31s", cmd, a, b, c, d) < 2)
        return;
    int g = gpu_arg(a);
    if (g < 0)
        return;
    struct gpu *p = &S.gpus[g];
    if (mig_command(cmd, g, b, c, d) || gpm_command(cmd, g, b, c))
        return;
    if (!strcmp(cmd, "xid")) { /* xid <gpu> <code> [<gi> <ci>]: on one MIG instance */
        push_event_on(g, EV_XID, strtoull(b, NULL, 10), c[0] ? (unsigned int)atoi(c) : ~0U,
                      d[0] ? (unsigned int)atoi(d) : ~0U);
    } else if (!strcmp(cmd, "dbe")) {
        if (p->noecc)
            return; /* no ECC: no ECC errors to report */
        p->ecc_uncorrected++;
        push_event(g, EV_DBE, 0);
    } else if (!strcmp(cmd, "ecc")) {
        p->ecc_uncorrected = strtoull(b, NULL, 10);
    } else if (!strcmp(cmd, "temp")) {
        p->temp = atoi(b);
    } else if (!strcmp(cmd, "lost")) {
        p->lost = 1;
        S.lost_pending = 1;
    } else if (!strcmp(cmd, "back")) {
        p->lost = 0;
        p->ecc_uncorrected = 0; /* a reset clears the volatile counters */
    } else if (!strcmp(cmd, "proc")) {
        unsigned int pid = (unsigned int)strtoul(b, NULL, 10);
        int i;
        for (i = 0; i < p->nprocs && p->procs[i].pid != pid; i++)
            ;
        if (i == MAX_PROC)
            return;
        if (i == p->nprocs)
            p->nprocs++;
        p->procs[i] = (struct proc){pid, strtoull(c, NULL, 10), now_us(), (unsigned int)atoi(d)};
    } else if (!strcmp(cmd, "noproc")) {
        unsigned int pid = (unsigned int)strtoul(b, NULL, 10);
        for (int i = 0; i < p->nprocs; i++) {
            if (p->procs[i].pid == pid) {
                p->procs[i] = p->procs[--p->nprocs];
                break;
            }
        }
    }
}

/* Apply the control lines appended since the last look (whole lines only). Called with S.mu held. */
static void ingest(void)
{
    if (!S.control[0])
        return;
    FILE *f = fopen(S.control, "r");
    if (!f)
        return;
    char line[LINE_MAX_LEN];
    if (fseek(f, S.control_off, SEEK_SET) == 0) {
        while (fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            if (n > 0 && line[n - 1] == '\n') {
                S.control_off += (long)n;
                apply_command(line);
                continue;
            }
            if (n + 1 < sizeof line)
                break; /* partial line (still being written): read it next time */
            /* longer than a command can be: skip to its end, never apply a piece of it */
            long skipped = (long)n;
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n')
                skipped++;
            if (c == EOF)
                break; /* its end is not written yet: skip it whole next time */
            S.control_off += skipped + 1;
        }
    }
    fclose(f);
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src);
}

static nvmlReturn_t load_spec(void)
{
    const char *path = getenv("FAKE_NVML_NODE");
    if (!path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    copy_str(S.loaded, sizeof S.loaded, path);
    memset(S.gpus, 0, sizeof S.gpus);
    mig_reset_state();
    gpm_reset_state();
    for (int i = 0; i < MAX_GPU; i++)
        for (int j = 0; j < MAX_GPU; j++)
            S.anc[i][j] = 50;
    S.count = 0;
    S.cuda = 12040;
    S.control[0] = 0;
    S.control_off = 0;
    S.qhead = S.qlen = S.lost_pending = 0;
    S.set.used = 0;
    copy_str(S.driver, sizeof S.driver, "550.54.15");
    nvmlReturn_t rc = NVML_SUCCESS;
    char line[LINE_MAX_LEN];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char key[16] = "";
        int used = 0;
        if (sscanf(line, "%15s %n", key, &used) < 1)
            continue;
        const char *rest = line + used;
        if (mig_spec_line(key, rest) || gpm_spec_line(key, rest))
            continue;
        if (!strcmp(key, "driver")) {
            copy_str(S.driver, sizeof S.driver, rest);
        } else if (!strcmp(key, "cuda")) {
            S.cuda = atoi(rest);
        } else if (!strcmp(key, "init_error")) {
            rc = atoi(rest);
        } else if (!strcmp(key, "control")) {
            copy_str(S.control, sizeof S.control, rest);
        } else if (!strcmp(key, "gpu") && S.count < MAX_GPU) {
            struct gpu *g = &S.gpus[S.count];
            int name_at = 0;
            if (sscanf(rest, "%95s %u %31s %llu %x %n", g->uuid, &g->minor, g->bus, &g->mem_mib, &g->devid,
                       &name_at) >= 5) {
                copy_str(g->name, sizeof g->name, rest + name_at);
                g->present = 1;
                g->temp = 40;
                g->memaff = -1;
                S.count++;
            }
        } else if (!strcmp(key, "nvlinks")) {
            int gi, n;
            if (sscanf(rest, "%d %d", &gi, &n) == 2 && gi >= 0 && gi < S.count && n >= 0 && n <= MAX_LINK)
                S.gpus[gi].nlinks = n;
        } else if (!strcmp(key, "anc")) {
            int a, b, lvl;
            if (sscanf(rest, "%d %d %d", &a, &b, &lvl) == 3 && a >= 0 && b >= 0 && a < MAX_GPU && b < MAX_GPU)
                S.anc[a][b] = S.anc[b][a] = lvl;
        } else if (!strcmp(key, "link")) {
            int gi, l;
            char kind[16], bus[32];
            unsigned int devid;
            if (sscanf(rest, "%d %d %15s %31s %x", &gi, &l, kind, bus, &devid) == 5 && gi >= 0 && gi < S.count
                && l >= 0 && l < MAX_LINK) {
                struct link *k = &S.gpus[gi].links[l];
                k->kind = !strcmp(kind, "gpu") ? LINK_GPU : !strcmp(kind, "switch") ? LINK_SWITCH : LINK_NPU;
                copy_str(k->remote_bus, sizeof k->remote_bus, bus);
                k->remote_devid = devid;
            }
        } else if (!strcmp(key, "noecc")) {
            int gi;
            if (sscanf(rest, "%d", &gi) == 1 && gi >= 0 && gi < S.count)
                S.gpus[gi].noecc = 1;
        } else if (!strcmp(key, "memaff")) {
            int gi, node;
            if (sscanf(rest, "%d %d", &gi, &node) == 2 && gi >= 0 && gi < S.count)
                S.gpus[gi].memaff = node;
        }
    }
    fclose(f);
    mig_load(); /* instances the "hardware" already has */
    int major = 0, minor = 0;
    S.v3_layout = sscanf(S.driver, "%d.%d", &major, &minor) == 2 && major == 535 && minor >= 43 && minor <= 86;
    return rc;
}

static nvmlReturn_t do_init(void)
{
    pthread_mutex_lock(&S.mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    const char *path = getenv("FAKE_NVML_NODE");
    if (S.refs == 0 || !path || strcmp(path, S.loaded) != 0) /* a new node file starts a new node */
        rc = load_spec();
    if (rc == NVML_SUCCESS)
        S.refs++;
    pthread_mutex_unlock(&S.mu);
    return rc;
}

API nvmlReturn_t nvmlInit(void) { return do_init(); }
API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init();
}

API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&S.mu);
    nvmlReturn_t rc = S.refs ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (S.refs)
        S.refs--;
    pthread_mutex_unlock(&S.mu);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

/* Lock, check init and the handle, ingest the control file; on success the caller holds S.mu. */
static nvmlReturn_t enter(nvmlDevice_t d, int need_present)
{
    pthread_mutex_lock(&S.mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!S.refs)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (d && (d < S.gpus || d >= S.gpus + S.count))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else {
        mig_load();
        ingest();
        if (d && need_present && d->lost)
            rc = NVML_ERROR_GPU_IS_LOST;
    }
    if (rc != NVML_SUCCESS)
        pthread_mutex_unlock(&S.mu);
    return rc;
}

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&S.mu);
    return rc;
}

#define ENTER(d)                                                                                              \
    do {                                                                                                      \
        nvmlReturn_t rc_ = enter((d), 1);                                                                     \
        if (rc_ != NVML_SUCCESS)                                                                              \
            return rc_;                                                                                       \
    } while (0)

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    ENTER(NULL);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)S.count;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    ENTER(NULL);
    if (!device || index >= (unsigned int)S.count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &S.gpus[index];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t put_str(char *dst, unsigned int len, const char *src)
{
    if (!dst || strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    struct ci *mig;
    if (mig_handle(d, &mig) == NVML_SUCCESS) {
        char u[96];
        mig_uuid(mig, u, sizeof u);
        return leave(put_str(uuid, len, u));
    }
    ENTER(d);
    return leave(put_str(uuid, len, d->uuid));
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    struct ci *mig;
    if (mig_handle(d, &mig) == NVML_SUCCESS)
        return leave(put_str(name, len, mig_name(mig)));
    ENTER(d);
    return leave(put_str(name, len, d->name));
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
    struct ci *mig;
    if (mig_handle(d, &mig) == NVML_SUCCESS) {
        *minor = mig_minor(mig); /* the parent's /dev/nvidiaN */
        return leave(NVML_SUCCESS);
    }
    ENTER(d);
    *minor = d->minor;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len)
{
    ENTER(NULL);
    return leave(put_str(version, len, S.driver));
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    ENTER(NULL);
    *v = S.cuda;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

static unsigned long long used_bytes(const struct gpu *g)
{
    unsigned long long sum = 0;
    for (int i = 0; i < g->nprocs; i++)
        if (g->procs[i].mem != NVML_VALUE_NOT_AVAILABLE)
            sum += g->procs[i].mem;
    return sum;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    struct ci *mig;
    if (mig_handle(d, &mig) == NVML_SUCCESS) { /* the instance's own memory */
        *m = (nvmlMemory_t){ci_mem_mib(mig) << 20, ci_mem_mib(mig) << 20, 0};
        return leave(NVML_SUCCESS);
    }
    ENTER(d);
    m->total = d->mem_mib << 20;
    m->used = used_bytes(d);
    m->free = m->total > m->used ? m->total - m->used : 0;
    return leave(NVML_SUCCESS);
}

/* "00000000:07:00.0" -> the fields of nvmlPciInfo_t (busIdLegacy has a 4-digit domain). */
static void fill_pci(nvmlPciInfo_t *p, const char *bus, unsigned int devid)
{
    unsigned int dom = 0, b = 0, dev = 0, fn = 0;
    memset(p, 0, sizeof *p);
    sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dev, &fn);
    p->domain = dom;
    p->bus = b;
    p->device = dev;
    p->pciDeviceId = devid;
    snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.%X", dom, b, dev, fn);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xFFFF, b, dev, fn);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    ENTER(d);
    fill_pci(pci, d->bus, d->devid);
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node)
{
    (void)node;
    ENTER(d);
    return leave(NVML_ERROR_NOT_SUPPORTED); /* as on x86: only coherent (Grace) systems answer */
}

API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set, int scope)
{
    (void)scope;
    ENTER(d);
    if (!set || size == 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(set, 0, size * sizeof *set);
    int bits = (int)(8 * sizeof *set);
    if (d->memaff < 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if ((unsigned int)(d->memaff / bits) < size)
        set[d->memaff / bits] = 1UL << (d->memaff % bits);
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level)
{
    ENTER(a);
    if (!b || b < S.gpus || b >= S.gpus + S.count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *level = a == b ? 0 : S.anc[a - S.gpus][b - S.gpus];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t check_link(nvmlDevice_t d, unsigned int link)
{
    if (d->nlinks == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)d->nlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active)
{
    ENTER(d);
    nvmlReturn_t rc = check_link(d, link);
    if (rc == NVML_SUCCESS)
        *active = d->links[link].kind != LINK_NONE;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
    ENTER(d);
    nvmlReturn_t rc = check_link(d, link);
    if (rc == NVML_SUCCESS && d->links[link].kind == LINK_NONE)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        fill_pci(pci, d->links[link].remote_bus, d->links[link].remote_devid);
    return leave(rc);
}

#ifndef NO_REMOTE_TYPE
static const int link_type_nvml[] = {0xFF, 0x00, 0x02, 0x01}; /* nvmlIntNvLinkDeviceType_t */

API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, int *type)
{
    ENTER(d);
    nvmlReturn_t rc = check_link(d, link);
    if (rc == NVML_SUCCESS)
        *type = link_type_nvml[d->links[link].kind];
    return leave(rc);
}
#endif

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp)
{
    ENTER(d);
    if (sensor != 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = (unsigned int)d->temp;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    struct ci *mig;
    if (mig_handle(d, &mig) == NVML_SUCCESS)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* not on MIG devices */
    ENTER(d);
    if (in_mig_mode(d))
        return leave(NVML_ERROR_NOT_SUPPORTED); /* nor on MIG-enabled GPUs */
    unsigned int sum = 0;
    for (int i = 0; i < d->nprocs; i++)
        sum += d->procs[i].sm;
    u->gpu = sum > 100 ? 100 : sum;
    u->memory = 0;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *count)
{
    ENTER(d);
    if (!count || type < 0 || type > 1 || counter < 0 || counter > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d->noecc)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *count = type == 1 ? d->ecc_uncorrected : 0;
    return leave(NVML_SUCCESS);
}

/* The running-process list in one of three layouts (1: pid + memory; 2: + instance ids; 3: + CC memory). */
static nvmlReturn_t procs(nvmlDevice_t d, unsigned int *count, void *out, int layout)
{
    ENTER(d);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = (unsigned int)d->nprocs;
    if (*count < n || (!out && n)) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        if (layout == 3)
            ((nvmlProcessInfo_v3_t *)out)[i] = (nvmlProcessInfo_v3_t){d->procs[i].pid, d->procs[i].mem, ~0U, ~0U, 0};
        else if (layout == 2)
            ((nvmlProcessInfo_v2_t *)out)[i] = (nvmlProcessInfo_v2_t){d->procs[i].pid, d->procs[i].mem, ~0U, ~0U};
        else
            ((nvmlProcessInfo_v1_t *)out)[i] = (nvmlProcessInfo_v1_t){d->procs[i].pid, d->procs[i].mem};
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v1_t *p)
{
    return procs(d, n, p, 0);
}
#ifndef NO_PROCS_V2
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v2_t *p)
{
    return procs(d, n, p, 2);
}
#endif
#ifndef NO_PROCS_V3
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *p)
{
    return procs(d, n, p, S.v3_layout ? 3 : 2);
}
#endif

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                                                 unsigned int *count, unsigned long long last_seen)
{
    struct ci *mig;
    if (mig_handle(d, &mig) == NVML_SUCCESS)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    ENTER(d);
    if (in_mig_mode(d))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int i = 0; i < d->nprocs; i++)
        n += d->procs[i].ts > last_seen;
    if (n == 0)
        return leave(NVML_ERROR_NOT_FOUND);
    if (!out || *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int k = 0;
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].ts > last_seen)
            out[k++] = (nvmlProcessUtilizationSample_t){d->procs[i].pid, d->procs[i].ts, d->procs[i].sm, 0, 0, 0};
    *count = k;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    ENTER(NULL);
    if (!set)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    S.set.used = 1;
    *set = &S.set;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    ENTER(NULL);
    if (set != &S.set)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    S.set.used = 0;
    for (int i = 0; i < S.count; i++)
        S.gpus[i].mask = 0;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
    ENTER(d);
    if (set != &S.set || !S.set.used)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((types & EV_DBE) && d->noecc)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* some requested type unsupported: none registered */
    d->mask |= types & (EV_DBE | EV_XID);
    return leave(NVML_SUCCESS);
}

#ifndef NO_SUPPORTED_EVENTS
API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
    ENTER(d);
    if (!types)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *types = EV_XID | (d->noecc ? 0ULL : EV_DBE);
    return leave(NVML_SUCCESS);
}
#endif

/* Wait up to `ms` for an event on a registered card; fills the v1 part of `out` (and the instance ids of v2). */
static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *out, unsigned int ms, int v2)
{
    unsigned long long deadline = now_us() + (unsigned long long)ms * 1000ULL;
    for (;;) {
        ENTER(NULL);
        if (set != &S.set || !S.set.used || !out)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        if (S.lost_pending) {
            S.lost_pending = 0;
            return leave(NVML_ERROR_GPU_IS_LOST);
        }
        while (S.qlen) {
            struct event e = S.q[S.qhead];
            S.qhead = (S.qhead + 1) % MAX_EVENTS;
            S.qlen--;
            if (!(S.gpus[e.gpu].mask & e.type))
                continue;
            out->device = &S.gpus[e.gpu];
            out->eventType = e.type;
            out->eventData = e.data;
            if (v2) {
                out->gpuInstanceId = e.gi;
                out->computeInstanceId = e.ci;
            }
            return leave(NVML_SUCCESS);
        }
        pthread_mutex_unlock(&S.mu);
        if (now_us() >= deadline)
            return NVML_ERROR_TIMEOUT;
        usleep(5000);
    }
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data, unsigned int ms)
{
    return wait_event(set, (nvmlEventData_t *)(void *)data, ms, 0);
}
#ifndef NO_WAIT_V2
API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms)
{
    return wait_event(set, data, ms, 1);
}
#endif

#include "fake_nvml_mig.c"
#include "fake_nvml_gpm.c"
