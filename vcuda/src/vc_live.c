#define _GNU_SOURCE
#include "vc_live.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vc_log.h"

static int live_fd = -1; /* the shared file, kept open: this process's slot lock lives on it */
static dev_t live_dev;
static ino_t live_ino;
static char live_path[1200];

/* The byte of the shared file whose lock says slot i is alive (past the end
 * of the data: locks need no bytes behind them). */
#define LIVE_OFFSET(i) ((off_t)0x40000000 + (off_t)(i))

void vc_live_adopt(int fd, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return;
    }
    if (live_fd >= 0)
        close(live_fd);
    live_fd = fd;
    live_dev = st.st_dev;
    live_ino = st.st_ino;
    snprintf(live_path, sizeof(live_path), "%s", path);
}

static int lock_op(int cmd, short type, int i, struct flock *fl)
{
    memset(fl, 0, sizeof(*fl));
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = LIVE_OFFSET(i);
    fl->l_len = 1;
    return live_fd >= 0 ? fcntl(live_fd, cmd, fl) : -1;
}

int vc_live_take(int i)
{
    struct flock fl;
    return lock_op(F_OFD_SETLK, F_WRLCK, i, &fl) == 0 ? 0 : -1;
}

void vc_live_drop(int i)
{
    struct flock fl;
    (void)lock_op(F_OFD_SETLK, F_UNLCK, i, &fl);
}

int vc_live_held(int i)
{
    struct flock fl;
    if (lock_op(F_OFD_GETLK, F_WRLCK, i, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

/* A fresh descriptor of the shared file, checked to be the same file; -1 if not. */
static int reopen(void)
{
    struct stat st;
    int fd = live_path[0] ? open(live_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW) : -1;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != live_dev || st.st_ino != live_ino)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

void vc_live_after_fork(void *map, size_t size)
{
    if (live_fd < 0)
        return;
    int fd = reopen();
    if (fd >= 0 && mmap(map, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        close(fd);
        fd = -1;
    }
    close(live_fd);
    live_fd = fd; /* -1: this child cannot lock a slot; liveness by pid */
}

void vc_live_check_fd(void)
{
    struct stat st;
    if (live_fd < 0 || (fstat(live_fd, &st) == 0 && st.st_dev == live_dev && st.st_ino == live_ino))
        return;
    live_fd = reopen(); /* the old number is the application's now: not closed */
    VC_DEBUG("the shared state's descriptor was closed by the application; reopened");
}

/* State (field 3) and start time (field 22) of a process; 0 if unreadable. */
static uint64_t proc_stat(int pid, char *state)
{
    *state = 0;
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    /* Field 22 (starttime); the command name (field 2) may contain spaces. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    if (p[1] == ' ' && p[2])
        *state = p[2];
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    return strtoull(p, NULL, 10);
}

uint64_t vc_live_start_time(int pid)
{
    char state;
    return proc_stat(pid, &state);
}

/* Threads of a process (its "Threads:" line), 0 if unreadable. */
static int proc_threads(int pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *t = strstr(buf, "\nThreads:");
    return t ? atoi(t + 9) : 0;
}

int vc_live_pid_dead(int pid, uint64_t start_time)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char state;
    uint64_t st = proc_stat(pid, &state);
    if ((state == 'Z' || state == 'X' || state == 'x') && proc_threads(pid) <= 1)
        return 1;
    return st != 0 && start_time != 0 && st != start_time;
}
