#define _GNU_SOURCE
#include "vc_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vc_live.h"
#include "vc_log.h"

static int my_slot = -1;
static int my_pid;
static char shm_path[1200];

const char *vc_shm_path(void)
{
    return shm_path;
}

static int slot_is_dead(const struct vc_shm *s, int i)
{
    const struct vc_slot *sl = &s->slots[i];
    if (sl->pid == 0)
        return 0;
    if (i == my_slot && sl->pid == my_pid)
        return 0; /* this process (its own lock never conflicts with itself) */
    if (sl->locked) {
        int held = vc_live_held(i);
        if (held >= 0)
            return !held;
    }
    return vc_live_pid_dead(sl->pid, sl->start_time);
}

static void recompute(struct vc_shm *s)
{
    for (int d = 0; d < VC_MAX_DEV; d++) {
        uint64_t u = 0, o = 0;
        for (int i = 0; i < VC_MAX_SLOTS; i++) {
            u += s->slots[i].used[d];
            o += s->slots[i].overhead[d];
        }
        s->used[d] = u;
        s->overhead[d] = o;
    }
}

static void lock(struct vc_shm *s)
{
    int r = pthread_mutex_lock(&s->lock);
    if (r == EOWNERDEAD) {
        /* A process died holding the lock: its update may be half done.
         * The slots are the truth; rebuild the totals from them. */
        recompute(s);
        pthread_mutex_consistent(&s->lock);
        VC_WARN("a process died holding the shared lock; usage recomputed");
    }
}

static void unlock(struct vc_shm *s)
{
    pthread_mutex_unlock(&s->lock);
}

static void init_region(struct vc_shm *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &a);
    pthread_mutexattr_destroy(&a);
    s->version = VC_SHM_VERSION;
    s->size = (uint32_t)sizeof(*s);
    __atomic_store_n(&s->magic, VC_SHM_MAGIC, __ATOMIC_RELEASE);
}

static struct vc_shm *private_region(void)
{
    struct vc_shm *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        static struct vc_shm fallback;
        s = &fallback;
    }
    init_region(s);
    return s;
}

static int key_of(const char *path, char *out, size_t cap)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = 0;
    else if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof(dir), ".");
    struct stat st;
    if (stat(dir, &st) != 0)
        return -1;
    snprintf(out, cap, "%llx-%llx", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    return 0;
}

struct vc_shm *vc_shm_attach(const char *shared_dir, const char *key_path_a, const char *key_path_b)
{
    char key[128];
    if (key_of(key_path_a, key, sizeof(key)) != 0 && key_of(key_path_b, key, sizeof(key)) != 0)
        snprintf(key, sizeof(key), "default");
    char path[1200];
    snprintf(path, sizeof(path), "%s/vcuda-v%u-%s.shm", shared_dir, VC_SHM_VERSION, key);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        VC_WARN("cannot open shared state %s (%s); limits apply to this process only", path, strerror(errno));
        return private_region();
    }
    (void)fchmod(fd, 0666); /* every user of the container may share it */
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < sizeof(struct vc_shm) &&
                                ftruncate(fd, (off_t)sizeof(struct vc_shm)) != 0)) {
        VC_WARN("cannot size shared state %s (%s); limits apply to this process only", path, strerror(errno));
        close(fd);
        return private_region();
    }
    struct vc_shm *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED) {
        VC_WARN("cannot map shared state %s (%s); limits apply to this process only", path, strerror(errno));
        close(fd);
        return private_region();
    }
    if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != VC_SHM_MAGIC || s->version != VC_SHM_VERSION ||
        s->size != sizeof(*s))
        init_region(s); /* new file, or left half-made by a process that died under the flock */
    flock(fd, LOCK_UN);
    vc_live_adopt(fd, path);
    snprintf(shm_path, sizeof(shm_path), "%s", path);
    VC_DEBUG("shared state %s", path);
    return s;
}

/* A free slot this process can lock (a free slot whose lock someone still
 * holds, e.g. a forked child that has not let go of its parent's file yet, is
 * skipped); -1 if none. Sets *locked. Called with the lock held. */
static int free_slot(struct vc_shm *s, int *locked)
{
    int fallback = -1;
    for (int i = 0; i < VC_MAX_SLOTS; i++) {
        if (s->slots[i].pid != 0)
            continue;
        if (vc_live_take(i) == 0) {
            *locked = 1;
            return i;
        }
        if (fallback < 0 && vc_live_held(i) != 1)
            fallback = i; /* the file cannot be locked at all: liveness by pid */
    }
    *locked = 0;
    return fallback;
}

int vc_shm_claim(struct vc_shm *s, int host_pid)
{
    int pid = getpid();
    uint64_t st = vc_live_start_time(pid);
    lock(s);
    int locked = 0;
    int found = free_slot(s, &locked);
    if (found < 0) {
        int changed = 0;
        for (int i = 0; i < VC_MAX_SLOTS; i++) {
            if (slot_is_dead(s, i)) {
                memset(&s->slots[i], 0, sizeof(s->slots[i]));
                changed = 1;
            }
        }
        if (changed)
            recompute(s);
        found = free_slot(s, &locked);
    }
    if (found >= 0) {
        struct vc_slot *sl = &s->slots[found];
        memset(sl, 0, sizeof(*sl));
        sl->pid = pid;
        sl->host_pid = host_pid;
        sl->locked = (uint32_t)locked;
        sl->start_time = st;
    }
    unlock(s);
    my_slot = found;
    my_pid = pid;
    return found >= 0 ? 0 : -1;
}

int vc_shm_claim_if_needed(struct vc_shm *s, int host_pid)
{
    if (my_slot < 0 || my_pid != getpid())
        return vc_shm_claim(s, host_pid);
    return 0;
}

int vc_shm_has_slot(void)
{
    return my_slot >= 0;
}

void vc_shm_forget_slot(struct vc_shm *s)
{
    my_slot = -1;
    my_pid = 0;
    vc_live_after_fork(s, sizeof(*s));
}

void vc_shm_release_slot(struct vc_shm *s)
{
    if (my_slot < 0 || my_pid != getpid())
        return;
    lock(s);
    struct vc_slot *sl = &s->slots[my_slot];
    if (sl->pid == my_pid) {
        if (sl->locked)
            vc_live_drop(my_slot);
        memset(sl, 0, sizeof(*sl));
        recompute(s);
    }
    unlock(s);
    my_slot = -1;
}

static struct vc_slot *mine(struct vc_shm *s)
{
    if (my_slot < 0)
        return NULL;
    struct vc_slot *sl = &s->slots[my_slot];
    return sl->pid == my_pid ? sl : NULL;
}

static void sweep_locked(struct vc_shm *s)
{
    int changed = 0;
    for (int i = 0; i < VC_MAX_SLOTS; i++) {
        if (slot_is_dead(s, i)) {
            VC_INFO("process %d is gone; giving back its memory", s->slots[i].pid);
            memset(&s->slots[i], 0, sizeof(s->slots[i]));
            changed = 1;
        }
    }
    if (changed)
        recompute(s);
}

int vc_shm_reserve(struct vc_shm *s, int d, uint64_t bytes, uint64_t limit)
{
    lock(s);
    struct vc_slot *sl = mine(s);
    if (!sl) {
        /* No slot: these bytes could not be given back if this process died,
         * and the totals are rebuilt from the slots. Refused. */
        unlock(s);
        return -2;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t in_use = s->used[d] + s->overhead[d];
        if (limit == VC_NO_CAP || (in_use <= limit && bytes <= limit - in_use)) {
            s->used[d] += bytes;
            sl->used[d] += bytes;
            unlock(s);
            return 0;
        }
        if (attempt == 0)
            sweep_locked(s); /* a dead process may still hold some of it */
    }
    unlock(s);
    return -1;
}

void vc_shm_unreserve(struct vc_shm *s, int d, uint64_t bytes)
{
    lock(s);
    struct vc_slot *sl = mine(s);
    if (sl) { /* only a slot's bytes are in the totals */
        sl->used[d] -= bytes <= sl->used[d] ? bytes : sl->used[d];
        s->used[d] -= bytes <= s->used[d] ? bytes : s->used[d];
    }
    unlock(s);
}

uint64_t vc_shm_in_use(struct vc_shm *s, int d)
{
    lock(s);
    uint64_t v = s->used[d] + s->overhead[d];
    unlock(s);
    return v;
}

uint64_t vc_shm_own_used(struct vc_shm *s, int d)
{
    lock(s);
    struct vc_slot *sl = mine(s);
    uint64_t v = sl ? sl->used[d] : 0;
    unlock(s);
    return v;
}

void vc_shm_set_overhead(struct vc_shm *s, int d, uint64_t bytes)
{
    lock(s);
    struct vc_slot *sl = mine(s);
    if (sl) {
        s->overhead[d] -= sl->overhead[d] <= s->overhead[d] ? sl->overhead[d] : s->overhead[d];
        sl->overhead[d] = bytes;
        s->overhead[d] += bytes;
    }
    unlock(s);
}

void vc_shm_sweep(struct vc_shm *s)
{
    lock(s);
    vc_live_check_fd();
    sweep_locked(s);
    unlock(s);
}

int vc_shm_host_pids(struct vc_shm *s, int *out, int cap)
{
    int n = 0;
    for (int i = 0; i < VC_MAX_SLOTS && n < cap; i++) {
        int hp = __atomic_load_n(&s->slots[i].host_pid, __ATOMIC_RELAXED);
        if (__atomic_load_n(&s->slots[i].pid, __ATOMIC_RELAXED) != 0 && hp != 0)
            out[n++] = hp;
    }
    return n;
}

int vc_shm_any_unknown_pid(struct vc_shm *s)
{
    for (int i = 0; i < VC_MAX_SLOTS; i++)
        if (__atomic_load_n(&s->slots[i].pid, __ATOMIC_RELAXED) != 0 &&
            __atomic_load_n(&s->slots[i].host_pid, __ATOMIC_RELAXED) == 0)
            return 1;
    return 0;
}

void vc_shm_set_nvml(struct vc_shm *s, uint32_t mask)
{
    lock(s);
    struct vc_slot *sl = mine(s);
    if (sl)
        sl->nvml_mask = mask;
    unlock(s);
}

int vc_shm_nvml_anyone(struct vc_shm *s, int d)
{
    for (int i = 0; i < VC_MAX_SLOTS; i++)
        if (__atomic_load_n(&s->slots[i].pid, __ATOMIC_RELAXED) != 0 &&
            (__atomic_load_n(&s->slots[i].nvml_mask, __ATOMIC_RELAXED) & (1u << d)))
            return 1;
    return 0;
}
