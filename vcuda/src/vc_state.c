#define _GNU_SOURCE
#include "vc_state.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vc_hooks.h"
#include "vc_loader.h"
#include "vc_log.h"
#include "vc_pfn.h"
#include "vc_register.h"
#include "vc_settings.h"
#include "vc_table.h"
#include "vc_throttle.h"

#define REGISTER_TIMEOUT_MS 3000

struct vc_state vc = {.single_slot = -1};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int closed_reported;
static int atfork_set;

/* A forked child is a new process of the container: it learns its own
 * identity again (its host PID, from the vDevice server or its PID
 * namespace), takes its own slot when it uses CUDA, and starts its own
 * limiter thread. Only async-signal-safe work is done here (the child of a
 * multithreaded parent); the rest happens at its first CUDA or NVML call. */
static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&dev_mu, &fresh, sizeof(dev_mu));
    memcpy(&init_mu, &fresh, sizeof(init_mu));
    if (vc.shm)
        vc_shm_forget_slot(vc.shm);
    vc_table_reset();
    vc_throttle_after_fork();
    vc.host_pid = 0;
    atomic_store(&vc.phase, VC_PHASE_NEW);
}

__attribute__((destructor)) static void on_exit_release(void)
{
    int p = atomic_load(&vc.phase);
    if ((p == VC_PHASE_LIMITS || p == VC_PHASE_READY) && vc.shm)
        vc_shm_release_slot(vc.shm);
}

static void describe(const struct vc_limits *l)
{
    VC_INFO("limits from %s: core_limit=%d hard_limit=%d core_ceiling=%d devices=%d host_pid=%d", l->source,
            l->core_limit, l->hard_limit, l->core_ceiling, l->device_count, vc.host_pid);
    for (int i = 0; i < l->device_count; i++)
        VC_INFO("limits device %d: uuid=%s memory_limit=%llu", i, l->dev[i].uuid[0] ? l->dev[i].uuid : "(any)",
                (unsigned long long)l->dev[i].memory_limit);
}

/* getpid() when it is the pid NVML reports (this process is in the host's,
 * the initial, PID namespace: its fixed inode PROC_PID_INIT_INO), else 0. */
static int own_pid_if_host(void)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0 && st.st_ino == 0xEFFFFFFCu)
        return getpid();
    return 0;
}

static void load_limits(void)
{
    const struct vc_settings *s = vc_settings();
    if (vc_loader_cuda() != 0) {
        atomic_store(&vc.phase, VC_PHASE_NODRIVER);
        return;
    }
    char id[80];
    vc_container_id(id, sizeof(id));
    struct vc_register_req req = {.container_id = id, .pid = getpid()};
    char sock_err[512] = "", file_err[512] = "";
    struct vc_limits l;
    int ok = vc_register_retrying(s->socket_path, REGISTER_TIMEOUT_MS, &req, &l, sock_err, sizeof(sock_err)) == 0;
    int registered = ok;
    if (!ok) {
        VC_DEBUG("registration: %s", sock_err);
        ok = vc_limits_parse_file(s->limits_path, &l, file_err, sizeof(file_err)) == 0;
        if (!ok)
            VC_DEBUG("limits file: %s", file_err);
    }
    if (!ok) {
        snprintf(vc.fail_reason, sizeof(vc.fail_reason), "%s; %s", sock_err, file_err);
        atomic_store(&vc.phase, VC_PHASE_CLOSED);
        return;
    }
    vc.limits = l;
    vc.host_pid = l.host_pid > 0 ? l.host_pid : own_pid_if_host();
    describe(&l);
    if (!vc.host_pid)
        VC_INFO("this process's host PID is unknown (%s), so NVML's per-process figures cannot be told apart "
                "from other containers': its compute limit is measured from the card's utilisation",
                registered ? "the vDevice server did not find it" : "limits from the file, not the vDevice server");
    if (!vc.shm) /* a forked child keeps the region (remapped from its own descriptor) */
        vc.shm = vc_shm_attach(s->shared_dir, s->limits_path, s->socket_path);
    if (!atfork_set) {
        atfork_set = 1;
        pthread_atfork(NULL, NULL, after_fork_child);
    }
    /* The slot is taken when CUDA is initialised (vc_devices_init): a process
     * that only asks NVML needs none. */
    atomic_store(&vc.phase, VC_PHASE_LIMITS);
}

int vc_process_init(void)
{
    int p = atomic_load(&vc.phase);
    if (p != VC_PHASE_NEW)
        return p;
    pthread_mutex_lock(&init_mu);
    if (atomic_load(&vc.phase) == VC_PHASE_NEW)
        load_limits();
    pthread_mutex_unlock(&init_mu);
    return atomic_load(&vc.phase);
}

void vc_report_closed(void)
{
    if (atomic_exchange(&closed_reported, 1) == 0)
        VC_ERROR("no limits for this container, so CUDA is refused (cuInit returns CUDA_ERROR_NOT_PERMITTED): %s",
                 vc.fail_reason);
}

static void format_uuid(const CUuuid *u, char *out, size_t cap)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* CUDA reports a MIG instance's UUID as the same 16 bytes as its NVML
 * "MIG-..." UUID; the shim formats every CUDA UUID as "GPU-...". So the
 * "GPU-" and "MIG-" prefixes compare equal: the bytes name the device. */
static const char *uuid_body(const char *u)
{
    return (strncasecmp(u, "GPU-", 4) == 0 || strncasecmp(u, "MIG-", 4) == 0) ? u + 4 : u;
}

static int uuid_eq(const char *a, const char *b)
{
    return strcasecmp(uuid_body(a), uuid_body(b)) == 0;
}

static nvmlDevice_t nvml_handle_for(const char *uuid)
{
    static int nvml_started;
    if (vc_loader_nvml() != 0 || !REAL_I(nvmlInit_v2) || !REAL_I(nvmlDeviceGetHandleByUUID))
        return NULL;
    if (!nvml_started) {
        if (REAL_I(nvmlInit_v2)() != NVML_SUCCESS)
            return NULL;
        nvml_started = 1;
    }
    nvmlDevice_t h = NULL;
    if (REAL_I(nvmlDeviceGetHandleByUUID)(uuid, &h) == NVML_SUCCESS)
        return h;
    if (strncmp(uuid, "GPU-", 4) == 0) { /* CUDA's view of a MIG instance the limits did not name as one */
        char mig[100];
        snprintf(mig, sizeof(mig), "MIG-%s", uuid + 4);
        if (REAL_I(nvmlDeviceGetHandleByUUID)(mig, &h) == NVML_SUCCESS)
            return h;
    }
    return NULL;
}

/* Called with dev_mu held, after the real cuInit succeeded. */
static int map_devices(void)
{
    int count = 0;
    if (!REAL_I(cuDeviceGetCount) || REAL_I(cuDeviceGetCount)(&count) != CUDA_SUCCESS)
        return -1;
    if (count > VC_MAX_DEV) {
        VC_WARN("this process sees %d devices; only the first %d are mapped", count, VC_MAX_DEV);
        count = VC_MAX_DEV;
    }
    const struct vc_limits *l = &vc.limits;
    int taken[VC_MAX_LIMIT_DEV] = {0};
    for (int d = 0; d < count; d++) {
        CUuuid u;
        memset(&u, 0, sizeof(u));
        CUresult r = REAL_I(cuDeviceGetUuid_v2) ? REAL_I(cuDeviceGetUuid_v2)(&u, d)
                                                 : (REAL_I(cuDeviceGetUuid) ? REAL_I(cuDeviceGetUuid)(&u, d)
                                                                            : CUDA_ERROR_NOT_FOUND);
        if (r == CUDA_SUCCESS)
            format_uuid(&u, vc.uuid[d], sizeof(vc.uuid[d]));
        else
            vc.uuid[d][0] = 0;
        vc.slot_of[d] = VC_UNMATCHED;
        for (int i = 0; i < l->device_count; i++) {
            if (!taken[i] && l->dev[i].uuid[0] && vc.uuid[d][0] && uuid_eq(l->dev[i].uuid, vc.uuid[d])) {
                vc.slot_of[d] = i;
                taken[i] = 1;
                snprintf(vc.uuid[d], sizeof(vc.uuid[d]), "%s", l->dev[i].uuid); /* MIG-... for an instance */
                break;
            }
        }
        int align = 0;
        if (REAL_I(cuDeviceGetAttribute) &&
            REAL_I(cuDeviceGetAttribute)(&align, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, d) == CUDA_SUCCESS &&
            align > 0)
            vc.pitch_align[d] = (uint64_t)align;
        else
            vc.pitch_align[d] = 0;
    }
    /* Entries without a UUID go, in order, to devices no UUID matched. */
    for (int d = 0; d < count; d++) {
        if (vc.slot_of[d] != VC_UNMATCHED)
            continue;
        for (int i = 0; i < l->device_count; i++) {
            if (!taken[i] && !l->dev[i].uuid[0]) {
                vc.slot_of[d] = i;
                taken[i] = 1;
                break;
            }
        }
    }
    for (int s = 0; s < VC_MAX_DEV; s++)
        vc.mem_limit[s] = vc_cap_of_slot(s);
    vc.ndev = count;
    int throttle = l->core_limit > 0 && l->core_limit < 100;
    uint32_t mask = 0;
    for (int d = 0; d < count; d++) {
        int s = vc.slot_of[d];
        if (!vc.nvml[s] && vc.uuid[d][0])
            vc.nvml[s] = nvml_handle_for(vc.uuid[d]);
        if (vc.nvml[s] && s >= 0 && s < 32)
            mask |= 1u << s;
    }
    vc.nvml_mask = mask;
    vc_shm_set_nvml(vc.shm, mask); /* before the limiter looks for processes that can measure */
    for (int d = 0; d < count; d++) {
        int s = vc.slot_of[d];
        if (s == VC_UNMATCHED)
            VC_ERROR("device %d (%s) is not named in the limits (%d entries), so its memory is refused to this "
                     "container: every allocation on it returns CUDA_ERROR_OUT_OF_MEMORY",
                     d, vc.uuid[d][0] ? vc.uuid[d] : "unknown UUID", l->device_count);
        if (throttle) {
            if (vc.nvml[s])
                vc_throttle_enable(s, vc.shm);
            else
                vc_throttle_unmeasurable(s, vc.shm, d, "NVML does not know the device");
        }
        char mem[32];
        if (vc.mem_limit[s] == VC_NO_CAP)
            snprintf(mem, sizeof(mem), "none");
        else
            snprintf(mem, sizeof(mem), "%llu bytes", (unsigned long long)vc.mem_limit[s]);
        VC_INFO("device %d %s -> slot %d: memory limit %s, compute %s%d%%", d, vc.uuid[d], s, mem,
                throttle ? (l->hard_limit ? "hard " : "soft ") : "unlimited ", throttle ? l->core_limit : 100);
    }
    vc.single_slot = count == 1 ? vc.slot_of[0] : -1;
    return 0;
}

void vc_devices_init(void)
{
    pthread_mutex_lock(&dev_mu);
    if (atomic_load(&vc.phase) == VC_PHASE_LIMITS) {
        if (vc_shm_claim_if_needed(vc.shm, vc.host_pid) != 0) /* said (as an error) at its first allocation */
            VC_INFO("no free slot among the container's %d: this process's allocations are refused until one is",
                    VC_MAX_SLOTS);
        if (map_devices() == 0) {
            vc_throttle_configure(vc.limits.core_limit, vc.limits.hard_limit, vc.limits.core_ceiling);
            vc_watcher_start();
            atomic_store(&vc.phase, VC_PHASE_READY);
        }
    }
    pthread_mutex_unlock(&dev_mu);
}

int vc_enter_slow(void)
{
    int p = atomic_load(&vc.phase);
    if (p == VC_PHASE_NEW)
        p = vc_process_init();
    switch (p) {
    case VC_PHASE_READY:
        return VC_GO;
    case VC_PHASE_CLOSED:
        return CUDA_ERROR_NOT_PERMITTED;
    case VC_PHASE_NODRIVER:
        return CUDA_ERROR_NOT_INITIALIZED;
    default:
        break;
    }
    /* Limits are known; map devices if the real driver is initialised. */
    int n;
    if (!REAL_I(cuDeviceGetCount) || REAL_I(cuDeviceGetCount)(&n) != CUDA_SUCCESS)
        return VC_PASS;
    vc_devices_init();
    return atomic_load(&vc.phase) == VC_PHASE_READY ? VC_GO : VC_PASS;
}

uint64_t vc_cap_of_slot(int s)
{
    if (s < 0 || s >= vc.limits.device_count || s >= VC_MAX_LIMIT_DEV)
        return 0; /* not named in the limits: fail closed */
    uint64_t m = vc.limits.dev[s].memory_limit;
    return m ? m : VC_NO_CAP;
}

int vc_slot_for_uuid(const char *uuid)
{
    const struct vc_limits *l = &vc.limits;
    if (atomic_load(&vc.phase) == VC_PHASE_READY)
        for (int d = 0; d < vc.ndev; d++)
            if (vc.uuid[d][0] && uuid_eq(vc.uuid[d], uuid))
                return vc.slot_of[d];
    for (int i = 0; i < l->device_count; i++)
        if (l->dev[i].uuid[0] && uuid_eq(l->dev[i].uuid, uuid))
            return i;
    /* A device CUDA has not mapped: a UUID-less entry is unambiguous only
     * when it is the only entry and no CUDA device took it. */
    if (l->device_count == 1 && !l->dev[0].uuid[0]) {
        if (atomic_load(&vc.phase) == VC_PHASE_READY)
            for (int d = 0; d < vc.ndev; d++)
                if (vc.slot_of[d] == 0)
                    return VC_UNMATCHED;
        return 0;
    }
    return VC_UNMATCHED;
}

int vc_current_slot(void)
{
    if (vc.single_slot >= 0)
        return vc.single_slot;
    CUdevice d;
    if (!REAL_I(cuCtxGetDevice) || REAL_I(cuCtxGetDevice)(&d) != CUDA_SUCCESS)
        return -1;
    return vc_slot_of(d);
}
