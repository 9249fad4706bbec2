/* agent/probe.c — the reachability probe (probe.h): a plain TCP connect to each address, the
 * same path the data plane's mesh takes (a blackholed route or a dropped SYN fails it, as it
 * fails the mesh). All connects run at once under one deadline, so a check of 32 cut peers
 * costs the deadline, not 32 of them. The peer's program never accepts such a connection
 * mid-epoch; it waits in its listening socket's backlog until the next mesh setup, which drops
 * it as a handshake that never came (tcp_mesh.c). Runs on the agent's control thread. Host
 * names are resolved by getaddrinfo, which has no deadline of its own (addresses in plans are
 * what agents registered: usually numeric). */
#include "agent/probe.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Starts a non-blocking connect to addr ("host:port", "[v6]:port"): the socket (connected or
 * connecting), or -1 with *err set. */
static int connect_start(const char *addr, int *err) {
  char host[WAGMA_API_ADDR_MAX];
  const char *colon = strrchr(addr, ':');
  *err = EINVAL;
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
    return -1;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res) {
    *err = EHOSTUNREACH;
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
    *err = errno;
    close(fd);
    fd = -1;
  } else if (fd < 0) {
    *err = errno;
  }
  freeaddrinfo(res);
  return fd;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int wg_probe_reach(const char (*addrs)[WAGMA_API_ADDR_MAX], int n, double timeout_s, char *why,
                   size_t len) {
  struct pollfd *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  int *err = calloc((size_t)(n > 0 ? n : 1), sizeof *err);
  int ok = 0, pending = 0;
  if (why && len)
    why[0] = '\0';
  if (!p || !err) {
    free(p);
    free(err);
    if (why && len)
      snprintf(why, len, "out of memory");
    return 0;
  }
  for (int i = 0; i < n; i++) {
    p[i].fd = connect_start(addrs[i], &err[i]);
    p[i].events = POLLOUT;
    pending += p[i].fd >= 0;
    if (p[i].fd >= 0)
      err[i] = ETIMEDOUT; /* until it answers */
  }
  double deadline = mono_s() + timeout_s;
  while (pending > 0) {
    int ms = (int)((deadline - mono_s()) * 1000);
    if (ms <= 0)
      break;
    int r = poll(p, (nfds_t)n, ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    for (int i = 0; i < n; i++) {
      if (p[i].fd < 0 || !p[i].revents)
        continue;
      socklen_t sl = sizeof err[i];
      if (getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &err[i], &sl) != 0)
        err[i] = errno;
      close(p[i].fd);
      p[i].fd = -1;
      pending--;
    }
  }
  for (int i = 0; i < n; i++) {
    if (p[i].fd >= 0)
      close(p[i].fd); /* still connecting at the deadline: ETIMEDOUT */
    if (err[i] == 0)
      ok++;
    else if (why && len && !why[0])
      snprintf(why, len, "%s: %s", addrs[i], strerror(err[i]));
  }
  free(p);
  free(err);
  return ok;
}
