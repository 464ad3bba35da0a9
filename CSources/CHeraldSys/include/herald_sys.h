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

/* accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC; the new fd or -1 with errno. */
int hs_accept(int fd);

/* Names the calling thread for the kernel (top -H, perf, /proc/PID/task/N/comm),
 * cut to 15 bytes; 0 or an errno value. */
int hs_set_thread_name(const char *name);

#endif
