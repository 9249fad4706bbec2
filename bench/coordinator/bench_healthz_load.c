/* bench_healthz_load — GET /healthz latency of a running wagma-coordinator while many
 * connections list jobs (issue 9, item 4), against a named baseline: the same probes with no
 * load. Prints both, and the ratio.
 *
 *   bench_healthz_load PORT [SECONDS] [CONNECTIONS] [LEAVERS]
 *
 * The coordinator listens on 127.0.0.1:PORT. CONNECTIONS (default 1000) keep-alive
 * connections loop GET /v1/jobs (one default page) and read each answer; LEAVERS (default 0)
 * more connections send a list request and close at once, again and again. The load comes
 * from 127.0.0.2 and up, 100 connections per address (under the server's per-address limit);
 * the probes come from 127.0.0.1, each on a fresh connection (as a kubelet probes), every
 * 10 ms. One thread drives the load (epoll), one probes. Single run; no etcd access of its
 * own. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int port;

/* ---- probes ------------------------------------------------------------------------------- */

/* One GET /healthz on a fresh connection; seconds until the whole answer (2 s when none). */
static double probe(int *status) {
  static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  double t0 = now();
  *status = 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {.tv_sec = 2};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)sizeof req - 1) {
    if (fd >= 0)
      close(fd);
    return 2.0;
  }
  char buf[4096];
  size_t got = 0;
  for (;;) { /* the server closes after the answer (Connection: close) */
    ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  buf[got] = '\0';
  if (got > 12 && strncmp(buf, "HTTP/1.", 7) == 0)
    *status = atoi(buf + 9);
  return *status ? now() - t0 : 2.0;
}

typedef struct stats {
  double *v;
  int n, failed;
} stats_t;

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(stats_t *s, double p) {
  qsort(s->v, (size_t)s->n, sizeof *s->v, cmp);
  return s->n ? s->v[(int)(p * (s->n - 1) + 0.5)] : 0;
}

static void probe_for(double seconds, stats_t *s) {
  double end = now() + seconds;
  s->n = s->failed = 0;
  s->v = calloc(100000, sizeof *s->v);
  while (now() < end && s->n < 100000) {
    int st;
    s->v[s->n++] = probe(&st);
    s->failed += st != 200;
    usleep(10000);
  }
}

/* ---- load --------------------------------------------------------------------------------- */

typedef struct lconn {
  int fd, leaver;
  char src[16];
  size_t sent, head_len, body_need, body_got;
  char head[4096];
} lconn_t;

typedef struct load {
  lconn_t *c;
  int n, epfd;
  volatile int stop;
  long answers, busy, opens;
} load_t;

static const char list_req[] = "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n";

static void lopen(load_t *l, lconn_t *c) {
  struct sockaddr_in me = {.sin_family = AF_INET}, sa = {.sin_family = AF_INET};
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, c->src, &me.sin_addr);
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (c->fd < 0 || bind(c->fd, (struct sockaddr *)&me, sizeof me) != 0 ||
      (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS)) {
    if (c->fd >= 0)
      close(c->fd);
    c->fd = -1;
    return;
  }
  c->sent = c->head_len = c->body_need = c->body_got = 0;
  l->opens++;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c};
  epoll_ctl(l->epfd, EPOLL_CTL_ADD, c->fd, &ev);
}

static void lclose(load_t *l, lconn_t *c) {
  if (c->fd >= 0) {
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
  }
  c->fd = -1;
}

static void lstep(load_t *l, lconn_t *c) {
  for (int guard = 0; guard < 64 && c->fd >= 0; guard++) {
    if (c->sent < sizeof list_req - 1) {
      ssize_t n = send(c->fd, list_req + c->sent, sizeof list_req - 1 - c->sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno != EAGAIN && errno != EINPROGRESS && errno != ENOTCONN)
          lclose(l, c);
        return;
      }
      c->sent += (size_t)n;
      if (c->sent == sizeof list_req - 1 && c->leaver) {
        lclose(l, c);
        lopen(l, c);
        return;
      }
      continue;
    }
    char buf[65536];
    ssize_t n = recv(c->fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
      lclose(l, c);
      lopen(l, c);
      return;
    }
    if (n < 0)
      return;
    for (ssize_t i = 0; i < n; i++) {
      if (!c->body_need && c->head_len < sizeof c->head - 1) {
        c->head[c->head_len++] = buf[i];
        c->head[c->head_len] = '\0';
        if (strstr(c->head, "\r\n\r\n")) {
          const char *cl = strcasestr(c->head, "\r\nContent-Length:");
          c->body_need = (cl ? strtoul(cl + 17, NULL, 10) : 0) + 1;
          c->body_got = 1;
          if (strncmp(c->head, "HTTP/1.1 503", 12) == 0)
            l->busy++;
        }
        continue;
      }
      c->body_got++;
    }
    if (c->body_need && c->body_got >= c->body_need) {
      l->answers++;
      c->sent = c->head_len = c->body_need = c->body_got = 0;
    }
  }
}

static void *load_main(void *arg) {
  load_t *l = arg;
  struct epoll_event evs[256];
  for (int i = 0; i < l->n; i++)
    lopen(l, &l->c[i]);
  while (!l->stop) {
    int n = epoll_wait(l->epfd, evs, 256, 20);
    for (int i = 0; i < n; i++)
      lstep(l, evs[i].data.ptr);
    for (int i = 0; i < l->n; i++)
      if (l->c[i].fd < 0)
        lopen(l, &l->c[i]);
  }
  for (int i = 0; i < l->n; i++)
    lclose(l, &l->c[i]);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_healthz_load PORT [SECONDS] [CONNECTIONS] [LEAVERS]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  port = atoi(argv[1]);
  double seconds = argc > 2 ? atof(argv[2]) : 10;
  int conns = argc > 3 ? atoi(argv[3]) : 1000, leavers = argc > 4 ? atoi(argv[4]) : 0;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  stats_t base, loaded, after;
  probe_for(seconds / 2, &base);

  load_t l = {.n = conns + leavers};
  l.epfd = epoll_create1(EPOLL_CLOEXEC);
  l.c = calloc((size_t)l.n, sizeof *l.c);
  for (int i = 0; i < l.n; i++) {
    l.c[i].fd = -1;
    l.c[i].leaver = i >= conns;
    snprintf(l.c[i].src, sizeof l.c[i].src, "127.0.%d.%d", 1 + i / 100 / 250, 2 + (i / 100) % 250);
  }
  pthread_t th;
  pthread_create(&th, NULL, load_main, &l);
  sleep(1);
  long a0 = l.answers;
  double t0 = now();
  probe_for(seconds, &loaded);
  double rps = (double)(l.answers - a0) / (now() - t0);
  long busy = l.busy;
  l.stop = 1;
  pthread_join(th, NULL);
  probe_for(1.0, &after);

  double b50 = pct(&base, 0.5), b99 = pct(&base, 0.99), l50 = pct(&loaded, 0.5),
         l99 = pct(&loaded, 0.99), lmax = pct(&loaded, 1.0), amax = pct(&after, 1.0);
  printf("GET /healthz latency, fresh connection per probe, every 10 ms; load: %d connections "
         "looping GET /v1/jobs (default page)%s%d leavers\n",
         conns, leavers ? " + " : ", ", leavers);
  printf("| probes | n | failed | p50 ms | p99 ms | max ms | p99 vs baseline |\n");
  printf("|---|---|---|---|---|---|---|\n");
  printf("| baseline: no load | %d | %d | %.2f | %.2f | %.2f | 1.00x |\n", base.n, base.failed,
         b50 * 1e3, b99 * 1e3, pct(&base, 1.0) * 1e3);
  printf("| under list load | %d | %d | %.2f | %.2f | %.2f | %.2fx |\n", loaded.n, loaded.failed,
         l50 * 1e3, l99 * 1e3, lmax * 1e3, b99 > 0 ? l99 / b99 : 0);
  printf("| first second after the load | %d | %d | %.2f | %.2f | %.2f | %.2fx |\n", after.n,
         after.failed, pct(&after, 0.5) * 1e3, pct(&after, 0.99) * 1e3, amax * 1e3,
         b99 > 0 ? pct(&after, 0.99) / b99 : 0);
  printf("list load: %.0f answers/s (%ld of them 503 busy), %ld connections opened\n", rps, busy,
         l.opens);
  return 0;
}
