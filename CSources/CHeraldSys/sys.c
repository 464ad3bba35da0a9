#define _GNU_SOURCE
#include "herald_sys.h"

#include <errno.h>
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
