/* Thin shims over Linux system calls whose C types or macros Swift does not
 * import cleanly. */
#ifndef HERALD_SYS_H
#define HERALD_SYS_H

#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/* Peer credentials of a connected Unix socket (SO_PEERCRED); 0 or -errno. */
int hs_peer_credentials(int fd, uint32_t *uid, uint32_t *gid, int32_t *pid);

/* Supplementary groups of a connected Unix socket's peer (SO_PEERGROUPS) into
 * groups (room for capacity): the number of groups, which is more than capacity
 * when they did not fit (nothing useful was written then), or -errno. */
int hs_peer_groups(int fd, uint32_t *groups, int capacity);

/* Allocations of at least threshold bytes get pages of their own (mmap),
 * returned to the system when freed; also stops glibc from raising the
 * threshold after each such free (M_MMAP_THRESHOLD). */
void hs_malloc_large_buffers_mapped(size_t threshold);

/* Returns free heap memory to the system (malloc_trim(0)); 1 when some was. */
int hs_malloc_trim(void);

/* accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC; the new fd or -1 with errno. */
int hs_accept(int fd);

/* Names the calling thread for the kernel (top -H, perf, /proc/PID/task/N/comm),
 * cut to 15 bytes; 0 or an errno value. */
int hs_set_thread_name(const char *name);

/* Sets the nice value of the calling thread only (Linux); 0 or -errno. */
int hs_set_thread_nice(int nice);

/* Starts writing the file's dirty pages to disk without waiting
 * (sync_file_range SYNC_FILE_RANGE_WRITE): a later fsync of the file then
 * has little left to write. 0, or -errno. */
int hs_start_writeback(int fd);

/* Raises the soft limit on open descriptors (RLIMIT_NOFILE) to the hard one.
 * Writes the soft limit in force afterwards (raised or not) to soft and the
 * hard limit to hard; 0, or -errno when the raise was refused (the limits
 * written are then those in force). */
int hs_raise_nofile_limit(uint64_t *soft, uint64_t *hard);

#endif
