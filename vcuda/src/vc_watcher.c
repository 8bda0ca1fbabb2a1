/* The compute limiter's thread, one per process that has a device to limit
 * or memory overhead to watch: every 5 ms it checks whether the container
 * can measure each limited device (watch_measure()), keeps one it cannot
 * measure unthrottled, and otherwise lets go of a probe hold whose prober
 * stopped (vc_probe.c), refills the device's bucket and lets the controller
 * step (vc_throttle.c); every second it checks this process's memory
 * overhead and sweeps the shared state. With only memory to watch it wakes
 * once a second. */
#define _GNU_SOURCE
#include "vc_throttle_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "vc_log.h"
#include "vc_state.h"

#define WATCH_TICK_NS 5000000ull        /* watcher wakes every 5 ms */

static atomic_int watcher_running;

/* Whether the container can measure device slot s is a matter of which of
 * its processes have NVML, not of the first one to start: a process that can
 * measure takes up a limit given up for lack of NVML, and one that cannot
 * gives it up once no process that can is left (checked every second). */
static void watch_measure(int s, struct vc_throttle *t, int slow)
{
    unsigned mode = atomic_load(&t->mode);
    if (mode == VC_MEASURE_NONE && vc.nvml[s] && atomic_load(&t->none_local)) {
        atomic_store(&t->none_local, 0);
        vc_throttle_set_mode(s, t, VC_MEASURE_NONE, VC_MEASURE_PROCESS,
                             "a process of the container that has NVML started");
    } else if (mode != VC_MEASURE_NONE && !vc.nvml[s] && slow && !vc_shm_nvml_anyone(vc.shm, s)) {
        atomic_store(&t->none_local, 1);
        vc_throttle_set_mode(s, t, mode, VC_MEASURE_NONE, "no process of the container that has NVML for it is left");
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
                    vc_throttle_overhead(s);
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
            vc_probe_abandon(t, now);
            vc_throttle_refill(t, now);
            if (vc.nvml[s])
                vc_throttle_control(s, t, now); /* only processes that can measure step the controller */
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

void vc_watcher_after_fork(void)
{
    atomic_store(&watcher_running, 0);
}
