/* vcshmset: write a device slot's limiter fields in a container's shared
 * state file the way a process of the container can leave them, to test what
 * the others make of it.
 *   vcshmset FILE SLOT ending    a probe's end begun now and never finished
 *                                (its process died between two stores): the
 *                                phase says "ending", the launches are held
 * Prints OK, or FAIL and why (exit 1). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../src/vc_shm.h"

int main(int argc, char **argv)
{
    if (argc != 4 || strcmp(argv[3], "ending") != 0) {
        printf("FAIL usage: vcshmset FILE SLOT ending\n");
        return 1;
    }
    int slot = atoi(argv[2]);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0 || slot < 0 || slot >= VC_MAX_DEV) {
        printf("FAIL cannot open %s or bad slot %d\n", argv[1], slot);
        return 1;
    }
    struct vc_shm *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED || s->magic != VC_SHM_MAGIC || s->version != VC_SHM_VERSION || s->size != sizeof(*s)) {
        printf("FAIL %s is not a version %u shared state\n", argv[1], VC_SHM_VERSION);
        return 1;
    }
    struct vc_throttle *t = &s->thr[slot];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    atomic_store(&t->probe_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    atomic_store(&t->probe, VC_PROBE_ENDING);
    atomic_store(&t->tokens, VC_PROBE_HOLD);
    printf("OK\n");
    return 0;
}
