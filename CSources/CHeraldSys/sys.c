#define _GNU_SOURCE
#include "herald_sys.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int hs_peer_credentials(int fd, uint32_t *uid, uint32_t *gid, int32_t *pid)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
    *uid = cred.uid;
    *gid = cred.gid;
    *pid = cred.pid;
    return 0;
}

_Static_assert(sizeof(gid_t) == sizeof(uint32_t), "gid_t is 32 bits");

int hs_peer_groups(int fd, uint32_t *groups, int capacity)
{
    if (capacity <= 0) return -EINVAL;
    socklen_t len = (socklen_t)((size_t)capacity * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) {
        if (errno == ERANGE) return (int)(len / sizeof(gid_t));
        return -errno;
    }
    return (int)(len / sizeof(gid_t));
}

void hs_malloc_large_buffers_mapped(size_t threshold)
{
    mallopt(M_MMAP_THRESHOLD, (int)threshold);
}

int hs_malloc_trim(void)
{
    return malloc_trim(0);
}

int hs_accept(int fd)
{
    return accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

int hs_set_thread_name(const char *name)
{
    char cut[16];
    size_t i = 0;
    for (; name[i] && i < sizeof cut - 1; i++) cut[i] = name[i];
    cut[i] = 0;
    return pthread_setname_np(pthread_self(), cut);
}

int hs_set_thread_nice(int nice)
{
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice) != 0) return -errno;
    return 0;
}

int hs_raise_nofile_limit(uint64_t *soft, uint64_t *hard)
{
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -errno;
    *soft = limit.rlim_cur;
    *hard = limit.rlim_max;
    if (limit.rlim_cur >= limit.rlim_max) return 0;
    struct rlimit raised = { .rlim_cur = limit.rlim_max, .rlim_max = limit.rlim_max };
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) return -errno;
    *soft = raised.rlim_cur;
    return 0;
}

int hs_start_writeback(int fd)
{
    if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0) return -errno;
    return 0;
}
