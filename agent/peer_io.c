/* agent/peer_io.c — the TCP helpers of the agent's peer endpoints (peer_io.h): deadlines,
 * keepalive, and the waits and log lines of a served connection. No state, no threads of its
 * own, thread-safe; every wait is a poll() bounded by the caller's deadline. */
#include "agent/peer_io.h"

#include <arpa/inet.h>
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
#include "wagma/log_internal.h"
#include "wagma/status.h"

double wg_peer_frame_bound(double exchange_deadline_s) {
  double b = 2.0 * exchange_deadline_s;
  return b > WG_PEER_FRAME_MIN_S ? b : WG_PEER_FRAME_MIN_S;
}

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

/* Reads len bytes before the deadline (wg_mono). 0, or WAGMA_ETIMEDOUT, WAGMA_EPEER (closed:
 * errno 0, or reset / keepalive gone: errno says why), WAGMA_EIO. */
int wg_peer_recv(int fd, void *buf, size_t len, double deadline) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) {
      errno = 0;
      return WAGMA_EPEER;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return WAGMA_EPEER;
    int e = wg_peer_wait_readable(fd, deadline);
    if (e)
      return e;
  }
  return 0;
}

int wg_peer_wait_readable(int fd, double deadline) {
  for (;;) {
    double left = deadline - wg_mono();
    if (left <= 0)
      return WAGMA_ETIMEDOUT;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, (int)(left * 1000.0) + 1);
    if (r > 0)
      return 0; /* a byte, the peer's close, or an error: the next recv tells */
    if (r < 0 && errno != EINTR)
      return WAGMA_EIO;
  }
}

int wg_peer_keepalive(int fd) {
  int one = 1, idle = WG_PEER_KEEPIDLE_S, intvl = WG_PEER_KEEPINTVL_S, cnt = WG_PEER_KEEPCNT;
  unsigned user_ms = 1000u * (unsigned)(WG_PEER_KEEPIDLE_S + WG_PEER_KEEPCNT * WG_PEER_KEEPINTVL_S);
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms) != 0)
    return WAGMA_EIO;
  return 0;
}

int wg_peer_stale(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  return poll(&pfd, 1, 0) == 1 && pfd.revents != 0;
}

void wg_peer_name(int fd, char *buf, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  memset(&ss, 0, sizeof ss);
  char host[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET6) {
      const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    } else if (ss.ss_family == AF_INET) {
      const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    }
  }
  snprintf(buf, len, ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
}

int wg_peer_next_request(int fd, void *hdr, size_t hdr_len, double wait_s, double frame_s,
                         double *frame_deadline) {
  *frame_deadline = 0;
  int e = wg_peer_wait_readable(fd, wg_mono() + wait_s);
  if (e)
    return e;
  *frame_deadline = wg_mono() + frame_s;
  return wg_peer_recv(fd, hdr, hdr_len, *frame_deadline);
}

void wg_peer_log_drop(wagma_log_fn log, void *log_user, int level, const char *endpoint,
                      const char *peer, int e, int why, const char *what, double bound_s) {
  if (e == WAGMA_EPEER && why == 0)
    return; /* the peer closed: the normal end */
  if (e == WAGMA_ETIMEDOUT)
    wg_logf(log, log_user, level,
            "%s: closing the connection from %s: %s did not come within %.1f s", endpoint, peer,
            what, bound_s);
  else if (e == WAGMA_EPEER)
    wg_logf(log, log_user, level, "%s: connection from %s lost%s: %s", endpoint, peer,
            why == ETIMEDOUT ? " (no keepalive answer or data unacknowledged)" : "", strerror(why));
  else
    wg_logf(log, log_user, level, "%s: closing the connection from %s: %s", endpoint, peer,
            e == WAGMA_EPROTO ? "not a request of this endpoint" : wagma_strerror(e));
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
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
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
      wg_peer_keepalive(fd);
      *fd_out = fd;
      e = 0;
    } else {
      close(fd);
    }
  }
  freeaddrinfo(res);
  return e;
}

const char *wg_peer_missed(int n, double frame_deadline, double wait_s, double frame_s,
                           double *bound_s, int *idle) {
  int before_header = frame_deadline == 0;
  *bound_s = before_header ? wait_s : frame_s;
  *idle = before_header && n > 0;
  if (!before_header)
    return "a whole request header";
  return n == 0 ? "a first request" : "a request (idle connection)";
}
