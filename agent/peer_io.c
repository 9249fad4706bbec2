/* agent/peer_io.c — the TCP helpers of the agent's peer endpoints (peer_io.h). No state, no
 * threads of its own; every wait is a poll() bounded by the caller's deadline. */
#include "agent/peer_io.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wagma/clock_internal.h"
#include "wagma/status.h"

static int set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0)
    return -1;
  return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* Writes len bytes before the deadline (wg_mono). 0, or WAGMA_ETIMEDOUT / WAGMA_EPEER. */
int wg_peer_send(int fd, const void *buf, size_t len, double deadline) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return WAGMA_EPEER;
    double left = deadline - wg_mono();
    if (left <= 0)
      return WAGMA_ETIMEDOUT;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int ms = (int)(left * 1000.0) + 1;
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
      return WAGMA_EIO;
  }
  return 0;
}

/* Reads len bytes before the deadline (deadline < 0: no deadline). 0, or WAGMA_ETIMEDOUT,
 * WAGMA_EPEER (closed or reset). */
int wg_peer_recv(int fd, void *buf, size_t len, double deadline) {
  char *p = buf;
  while (len > 0) {
    if (deadline >= 0) {
      double left = deadline - wg_mono();
      if (left <= 0)
        return WAGMA_ETIMEDOUT;
      struct pollfd pfd = {.fd = fd, .events = POLLIN};
      int r = poll(&pfd, 1, (int)(left * 1000.0) + 1);
      if (r < 0 && errno != EINTR)
        return WAGMA_EIO;
      if (r <= 0)
        continue;
    }
    ssize_t n = recv(fd, p, len, deadline >= 0 ? MSG_DONTWAIT : 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n == 0) {
      return WAGMA_EPEER;
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return WAGMA_EPEER;
    }
  }
  return 0;
}

int wg_peer_listen(const char *host, int *fd_out, uint16_t *port_out) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (getaddrinfo(host && host[0] ? host : NULL, "0", &hints, &res) != 0 || !res)
    return WAGMA_EINVAL;
  int e = WAGMA_EIO;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
      continue;
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        *fd_out = fd;
        e = 0;
        break;
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  return e;
}

int wg_peer_connect(const char *host, uint16_t port_num, double deadline, int *fd_out) {
  struct addrinfo hints, *res = NULL;
  char port[16];
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  snprintf(port, sizeof port, "%u", (unsigned)port_num);
  if (getaddrinfo(host, port, &hints, &res) != 0 || !res)
    return WAGMA_EPEER;
  int e = WAGMA_EPEER;
  for (struct addrinfo *ai = res; ai && e; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
      continue;
    set_nonblock(fd, 1);
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r < 0 && errno == EINPROGRESS) {
      double left = deadline - wg_mono();
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int soerr = 0;
      socklen_t sl = sizeof soerr;
      if (left > 0 && poll(&pfd, 1, (int)(left * 1000.0) + 1) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
        r = 0;
      else if (left <= 0 || soerr == 0)
        e = WAGMA_ETIMEDOUT;
    }
    if (r == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *fd_out = fd;
      e = 0;
    } else {
      close(fd);
    }
  }
  freeaddrinfo(res);
  return e;
}
