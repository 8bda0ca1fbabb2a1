/* vcsyscall: a launch under the limit makes no system call and no getenv.
 * After a warm-up, a seccomp filter traps every system call of this thread
 * (the shim's own limiter thread is not filtered) while 1000 launches run;
 * the SIGSYS handler counts them. getenv calls are counted by a preloaded
 * interposer (libgetenv_count.so). Prints "SYSCALLS n GETENV m". */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>

#include "testlib.h"

static volatile long trapped;

static void on_sigsys(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)si;
    trapped++;
    ucontext_t *uc = ctx;
#if defined(__x86_64__)
    uc->uc_mcontext.gregs[REG_RAX] = -ENOSYS;
#else
    (void)uc;
#endif
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    void (*arm)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "getenv_count_arm");
    long (*value)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "getenv_count_value");
    if (!arm || !value) {
        printf("FAIL libgetenv_count.so is not preloaded\n");
        return 1;
    }
    if (t_setup(0) != 0)
        return 1;
    CUmodule mod;
    CUfunction fn;
    cuModuleLoadData(&mod, "fake");
    cuModuleGetFunction(&fn, mod, "k");
    /* Warm up the limiter at a real load, then let the bucket fill. */
    double end = t_now() + 2.0;
    while (t_now() < end) {
        cuLaunchKernel(fn, 100, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        static int k;
        if (++k % 32 == 0)
            cuCtxSynchronize();
    }
    cuCtxSynchronize();
    usleep(300000);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSYS, &sa, NULL);
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigreturn, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit_group, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_write, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 1), /* the test's own output on fd 1 */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sock_fprog prog = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        printf("FAIL cannot install the seccomp filter: %s\n", strerror(errno));
        return 1;
    }
    arm(1);
    int bad = 0;
    for (int i = 0; i < 1000; i++)
        if (cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
            bad++;
    arm(0);
    long sc = trapped, ge = value();
    char line[128];
    int n = snprintf(line, sizeof(line), "SYSCALLS %ld GETENV %ld FAILED %d\n", sc, ge, bad);
    ssize_t w = write(1, line, (size_t)n);
    (void)w;
    syscall(SYS_exit_group, 0);
    return 0;
}
