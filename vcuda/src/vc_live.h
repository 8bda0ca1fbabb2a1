/* Whether the process that holds a slot of the shared state is alive.
 *
 * A live process holds an open-file-description lock (F_OFD_SETLK) on its
 * slot's byte of the shared file. The kernel drops it when the process ends,
 * before it is reaped, and not while any of its threads runs; it does not
 * depend on PIDs, so it holds across PID namespaces (a pod's containers, or a
 * DRA claim's pods, share /dev/shm but not PIDs). The lock belongs to the
 * open file description, which the process's mapping of the file also holds,
 * so closing descriptors does not drop it. PIDs (with start time and state)
 * are only the fallback when the file cannot be locked. */
#ifndef VC_LIVE_H
#define VC_LIVE_H

#include <stddef.h>
#include <stdint.h>

/* Keep fd (the shared file at path, already mapped) open for the locks. */
void vc_live_adopt(int fd, const char *path);
/* Lock slot i for this process: 0, or -1 if it cannot be locked. */
int vc_live_take(int i);
/* Unlock slot i (a normal exit). */
void vc_live_drop(int i);
/* 1 if another process holds slot i's lock, 0 if nobody does, -1 if it
 * cannot be told. A process's own lock never shows. */
int vc_live_held(int i);
/* In a forked child: let go of the parent's open file description (its
 * descriptor and the mapping `map` of `size` bytes, remapped in place from a
 * fresh one), so that the child does not keep the parent's slot alive. */
void vc_live_after_fork(void *map, size_t size);
/* If the application closed our descriptor (the number may name another
 * file now), open the shared file again; never lock through a stranger. */
void vc_live_check_fd(void);

/* Start time of a process (field 22 of /proc/<pid>/stat), 0 if unreadable. */
uint64_t vc_live_start_time(int pid);
/* Fallback, by pid: gone, exited and not yet reaped (a zombie with no other
 * thread left: the driver has already freed its memory), or its pid now
 * belongs to another process. Only meaningful within one PID namespace. */
int vc_live_pid_dead(int pid, uint64_t start_time);

#endif
