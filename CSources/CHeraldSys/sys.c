#define _GNU_SOURCE
#include "herald_sys.h"

#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>

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
