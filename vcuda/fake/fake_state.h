/* The simulated GPU node shared by every process of a test: a file mapped
 * MAP_SHARED (path in FAKEGPU_STATE) created by `fakegpu init`. One memory pool
 * per device, one execution timeline per device (work from all processes runs
 * one at a time, in launch order), and per-process busy time in sampling
 * periods, from which the fake NVML reports utilisation. */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <pthread.h>
#include <stdint.h>

#define FG_MAGIC 0x46475055u /* "FGPU" */
#define FG_VERSION 5u
#define FG_MAX_DEV 4
#define FG_MAX_PROC 320 /* a container of 257+ processes (the shim's slot limit) */
#define FG_BUCKETS 512 /* 25.6 s of history at 50 ms periods */

struct fg_bucket {
    int64_t period;              /* period number this bucket holds, -1 = empty */
    uint64_t busy[FG_MAX_PROC];  /* ns of the period each process held the timeline */
};

struct fg_dev {
    char uuid[64];
    char name[64];
    uint64_t total;      /* bytes of the physical pool */
    uint64_t used;       /* bytes taken from the pool (allocations + contexts) */
    int32_t sms;
    int32_t arch;        /* NVML architecture (nvmlDeviceArchitecture_t; 0 = not said) */
    char parent[64];     /* a MIG instance (uuid "MIG-..."): its card's UUID, else "" */
    int32_t gi_id;       /* a MIG instance: its GPU instance ID */
    int32_t pad;
    uint64_t busy_until; /* end of the last piece of work on the timeline (ns, CLOCK_MONOTONIC) */
    struct fg_bucket buckets[FG_BUCKETS];
};

struct fg_proc {
    int32_t pid;      /* as the process sees itself */
    int32_t nvml_pid; /* as NVML reports it: the pid in the outermost namespace /proc shows (0 = pid) */
    uint64_t mem[FG_MAX_DEV];       /* bytes this process holds, contexts included */
    uint64_t last_end[FG_MAX_DEV];  /* when this process's queued work ends */
    int32_t ctxs[FG_MAX_DEV];       /* contexts it has on each device (NVML lists it while > 0) */
};

struct fg_shared {
    uint32_t magic;
    uint32_t version;
    pthread_mutex_t lock;
    int32_t ndev;
    int32_t driver_version;
    uint64_t period_ns;       /* NVML sampling period */
    uint64_t ctx_bytes;       /* device memory each context costs */
    uint64_t pitch_align;
    uint64_t next_ptr;
    struct fg_proc proc[FG_MAX_PROC];
    struct fg_dev dev[FG_MAX_DEV];
};

/* Map the state named by FAKEGPU_STATE (or `path` when not NULL). */
struct fg_shared *fg_attach(const char *path);
/* devices: "UUID:SIZE:SMS[:NAME[:ARCH[:PARENT_UUID:GI_ID]]];..." (ARCH: ampere, hopper, ... or a number) */
int fg_create(const char *path, const char *devices, uint64_t period_ns, uint64_t ctx_bytes, int driver_version);
void fg_lock(struct fg_shared *s);
void fg_unlock(struct fg_shared *s);
uint64_t fg_now_ns(void);
int fg_proc_slot(struct fg_shared *s, int pid); /* caller holds the lock */
/* This process's pid as a real driver would report it: the first NSpid entry
 * of /proc/self/status (the host pid when /proc is the host's), else getpid(). */
int fg_host_pid(void);
/* Put `dur` ns of work for process slot `p` on device `d`'s timeline; returns its end. */
uint64_t fg_schedule(struct fg_shared *s, int d, int p, uint64_t dur);
uint64_t fg_busy_ns(struct fg_shared *s, int d, int p, uint64_t t0, uint64_t t1);
void fg_sleep_until(uint64_t t_ns);
int fg_parse_uuid(const char *text, unsigned char out[16]);

#endif
