#define _GNU_SOURCE
#include "fake_state.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t fg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fg_sleep_until(uint64_t t_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull), .tv_nsec = (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t parse_size(const char *s)
{
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end && (*end == 'G' || *end == 'g'))
        v <<= 30;
    else if (end && (*end == 'M' || *end == 'm'))
        v <<= 20;
    return v;
}

static int parse_arch(const char *s)
{
    static const char *names[] = {"", "", "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper",
                                  "blackwell"};
    for (int i = 2; i < (int)(sizeof(names) / sizeof(names[0])); i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return atoi(s);
}

/* devices: see fake_state.h */
int fg_create(const char *path, const char *devices, uint64_t period_ns, uint64_t ctx_bytes, int driver_version)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)sizeof(struct fg_shared)) != 0) {
        close(fd);
        return -1;
    }
    struct fg_shared *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED)
        return -1;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &a);
    pthread_mutexattr_destroy(&a);
    s->period_ns = period_ns;
    s->ctx_bytes = ctx_bytes;
    s->driver_version = driver_version;
    s->pitch_align = 512;
    s->next_ptr = 0x7f0000000000ull;
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", devices);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";", &save); tok && s->ndev < FG_MAX_DEV; tok = strtok_r(NULL, ";", &save)) {
        struct fg_dev *d = &s->dev[s->ndev];
        char *f[7] = {0};
        int n = 0;
        char *save2 = NULL;
        for (char *p = strtok_r(tok, ":", &save2); p && n < 7; p = strtok_r(NULL, ":", &save2))
            f[n++] = p;
        if (n < 3) {
            munmap(s, sizeof(*s));
            return -1;
        }
        snprintf(d->uuid, sizeof(d->uuid), "%s", f[0]);
        d->total = parse_size(f[1]);
        d->sms = atoi(f[2]);
        snprintf(d->name, sizeof(d->name), "%s", n > 3 ? f[3] : "Fake GPU");
        d->arch = n > 4 ? parse_arch(f[4]) : 0;
        if (n > 6) {
            snprintf(d->parent, sizeof(d->parent), "%s", f[5]);
            d->gi_id = atoi(f[6]);
        }
        for (int b = 0; b < FG_BUCKETS; b++)
            d->buckets[b].period = -1;
        s->ndev++;
    }
    s->version = FG_VERSION;
    __atomic_store_n(&s->magic, FG_MAGIC, __ATOMIC_RELEASE);
    munmap(s, sizeof(*s));
    return 0;
}

struct fg_shared *fg_attach(const char *path)
{
    if (!path)
        path = getenv("FAKEGPU_STATE");
    if (!path || !*path)
        return NULL;
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct fg_shared)) {
        close(fd);
        return NULL;
    }
    struct fg_shared *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED)
        return NULL;
    if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != FG_MAGIC || s->version != FG_VERSION) {
        munmap(s, sizeof(*s));
        return NULL;
    }
    return s;
}

void fg_lock(struct fg_shared *s)
{
    int r = pthread_mutex_lock(&s->lock);
    if (r == EOWNERDEAD)
        pthread_mutex_consistent(&s->lock);
}

void fg_unlock(struct fg_shared *s)
{
    pthread_mutex_unlock(&s->lock);
}

/* Threads of a process ("Threads:" in /proc/<pid>/status), 0 if unreadable. */
static int fg_threads(int pid)
{
    char path[48], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *t = strstr(buf, "\nThreads:");
    return t ? atoi(t + 9) : 0;
}

/* A process the driver has let go: gone, or exited and waiting to be reaped
 * (a real driver frees a process's memory when it exits, before its parent
 * reaps it). A process whose main thread alone has ended also shows Z in
 * /proc/<pid>/stat, but its other threads still run and hold their memory. */
static int fg_gone(int pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[48], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    int exited = close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
    return exited && fg_threads(pid) <= 1;
}

int fg_host_pid(void)
{
    char buf[2048];
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return getpid();
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *t = strstr(buf, "\nNSpid:");
    int pid = t ? atoi(t + 7) : 0;
    return pid > 0 ? pid : getpid();
}

int fg_proc_slot(struct fg_shared *s, int pid)
{
    int free_slot = -1;
    for (int i = 0; i < FG_MAX_PROC; i++) {
        if (s->proc[i].pid == pid)
            return i;
        if (free_slot < 0 && (s->proc[i].pid == 0 || fg_gone(s->proc[i].pid)))
            free_slot = i;
    }
    if (free_slot < 0)
        return -1;
    struct fg_proc *p = &s->proc[free_slot];
    /* A dead process's memory goes back to the pool. */
    for (int d = 0; d < s->ndev; d++) {
        s->dev[d].used -= p->mem[d] <= s->dev[d].used ? p->mem[d] : s->dev[d].used;
    }
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    return free_slot;
}

static struct fg_bucket *bucket_for(struct fg_dev *d, int64_t period)
{
    struct fg_bucket *b = &d->buckets[period % FG_BUCKETS];
    if (b->period != period) {
        memset(b->busy, 0, sizeof(b->busy));
        b->period = period;
    }
    return b;
}

uint64_t fg_schedule(struct fg_shared *s, int d, int p, uint64_t dur)
{
    struct fg_dev *dev = &s->dev[d];
    uint64_t now = fg_now_ns();
    uint64_t start = dev->busy_until > now ? dev->busy_until : now;
    uint64_t end = start + dur;
    dev->busy_until = end;
    uint64_t P = s->period_ns;
    for (uint64_t t = start; t < end;) {
        int64_t period = (int64_t)(t / P);
        uint64_t pend = (uint64_t)(period + 1) * P;
        uint64_t seg_end = pend < end ? pend : end;
        bucket_for(dev, period)->busy[p] += seg_end - t;
        t = seg_end;
    }
    s->proc[p].last_end[d] = end;
    return end;
}

/* Busy ns of process slot p on device d in whole periods inside [t0, t1). */
uint64_t fg_busy_ns(struct fg_shared *s, int d, int p, uint64_t t0, uint64_t t1)
{
    uint64_t P = s->period_ns, sum = 0;
    for (uint64_t per = (t0 + P - 1) / P; (per + 1) * P <= t1; per++) {
        struct fg_bucket *b = &s->dev[d].buckets[per % FG_BUCKETS];
        if (b->period == (int64_t)per)
            sum += b->busy[p];
    }
    return sum;
}

int fg_parse_uuid(const char *text, unsigned char out[16])
{
    /* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (or MIG-...: a MIG instance's UUID, the same 16 bytes) */
    const char *p = text;
    if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0)
        p += 4;
    int n = 0;
    while (*p && n < 32) {
        if (*p == '-') {
            p++;
            continue;
        }
        int v;
        if (*p >= '0' && *p <= '9')
            v = *p - '0';
        else if (*p >= 'a' && *p <= 'f')
            v = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F')
            v = *p - 'A' + 10;
        else
            return -1;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(v << 4);
        else
            out[n / 2] |= (unsigned char)v;
        n++;
        p++;
    }
    return n == 32 ? 0 : -1;
}
