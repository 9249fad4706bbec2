/* agent/probe.c — the reachability probe (probe.h): a plain TCP connect to each address, the
 * same path the data plane's mesh takes (a blackholed route or a dropped SYN fails it, as it
 * fails the mesh). The peer's program never accepts it mid-epoch; the connection waits in its
 * listening socket's backlog until the next mesh setup, which drops it as a handshake that
 * never came (tcp_mesh.c). Runs on the agent's control thread; every connect has a deadline. */
#include "agent/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Connects to addr ("host:port") within timeout_s. 0 or an errno value (EAI_* as EHOSTUNREACH). */
static int connect_once(const char *addr, double timeout_s) {
  char host[WAGMA_API_ADDR_MAX];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
    return EINVAL;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [v6]:port */
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
    return EHOSTUNREACH;
  int err = ETIMEDOUT;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
  } else if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    err = 0;
  } else if (errno != EINPROGRESS) {
    err = errno;
  } else {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int ms = (int)(timeout_s * 1000);
    int r;
    do
      r = poll(&p, 1, ms > 0 ? ms : 1);
    while (r < 0 && errno == EINTR);
    if (r > 0) {
      socklen_t sl = sizeof err;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
        err = errno;
    }
  }
  if (fd >= 0)
    close(fd);
  freeaddrinfo(res);
  return err;
}

int wg_probe_reach(const char (*addrs)[WAGMA_API_ADDR_MAX], int n, double timeout_s, char *why,
                   size_t len) {
  int ok = 0;
  if (why && len)
    why[0] = '\0';
  for (int i = 0; i < n; i++) {
    int err = connect_once(addrs[i], timeout_s);
    if (err == 0)
      ok++;
    else if (why && len && !why[0])
      snprintf(why, len, "%s: %s", addrs[i], strerror(err));
  }
  return ok;
}
