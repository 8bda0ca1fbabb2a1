/* fakegpu: test helper for the simulated node.
 *   fakegpu init STATE DEVICES [PERIOD_MS] [CTX_BYTES] [DRIVER_VERSION]
 *       DEVICES = "UUID:SIZE:SMS[:NAME[:ARCH[:PARENT_UUID:GI_ID]]];..." (SIZE in bytes, or with M/G;
 *       a "MIG-..." UUID with a parent and GI ID is a MIG instance of that card)
 *   fakegpu busy STATE DEV T0_NS T1_NS PID...   busy share (percent) of the PIDs on DEV in [T0, T1)
 *   fakegpu now                                  CLOCK_MONOTONIC in ns
 *   fakegpu used STATE DEV                       bytes taken from DEV's pool */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_state.h"

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "now") == 0) {
        printf("%llu\n", (unsigned long long)fg_now_ns());
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "init") == 0) {
        uint64_t period = argc > 4 ? strtoull(argv[4], NULL, 10) * 1000000ull : 50000000ull;
        uint64_t ctx = argc > 5 ? strtoull(argv[5], NULL, 10) : 0;
        int drv = argc > 6 ? atoi(argv[6]) : 13000;
        if (fg_create(argv[2], argv[3], period, ctx, drv) != 0) {
            fprintf(stderr, "fakegpu: cannot create %s from '%s'\n", argv[2], argv[3]);
            return 1;
        }
        return 0;
    }
    if (argc >= 7 && strcmp(argv[1], "busy") == 0) {
        struct fg_shared *s = fg_attach(argv[2]);
        if (!s) {
            fprintf(stderr, "fakegpu: cannot open %s\n", argv[2]);
            return 1;
        }
        int d = atoi(argv[3]);
        uint64_t t0 = strtoull(argv[4], NULL, 10), t1 = strtoull(argv[5], NULL, 10);
        uint64_t busy = 0;
        for (int a = 6; a < argc; a++) {
            int pid = atoi(argv[a]);
            for (int p = 0; p < FG_MAX_PROC; p++)
                if (s->proc[p].pid == pid)
                    busy += fg_busy_ns(s, d, p, t0, t1);
        }
        uint64_t P = s->period_ns;
        uint64_t first = (t0 + P - 1) / P, last = t1 / P;
        uint64_t span = last > first ? (last - first) * P : 1;
        printf("%.2f\n", 100.0 * (double)busy / (double)span);
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "used") == 0) {
        struct fg_shared *s = fg_attach(argv[2]);
        if (!s)
            return 1;
        printf("%llu\n", (unsigned long long)s->dev[atoi(argv[3])].used);
        return 0;
    }
    fprintf(stderr, "usage: fakegpu init|busy|now|used ...\n");
    return 2;
}
