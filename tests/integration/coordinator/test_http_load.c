/* The REST server under hostile load (issue 9, item 4), against a real coordinator and etcd:
 * /healthz and /readyz must answer within 100 ms (p99) while hundreds of connections list
 * jobs, leave with requests in flight, never read their answers, or trickle their heads, and
 * at once after the load stops. Label timing: the assertions are wall-clock bounds.
 *
 * 300 jobs; the load comes from 127.0.0.2..127.0.0.5 (under the per-address limit), the
 * probes from 127.0.0.1, each probe on a fresh connection (as a kubelet probes):
 *   200 listers   GET /v1/jobs?limit=500 (a page of all 300 jobs), read it, again;
 *   100 leavers   connect, send a list request, close at once, again 50 ms later (2000
 *                 abandoned requests a second: more than the server can list);
 *    50 mutes     send 20 pipelined list requests, never read;
 *    50 slow      send half a head, then nothing.
 * Before the fix (handlers on MHD's 4 threads, the full list on every request, work done
 * for clients that left) /healthz waited seconds behind the lists. Last, with etcd killed,
 * /healthz and /readyz (503) still answer within 100 ms. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw_http.h"

#define NJOBS 300
#define LOAD_S 6.0

enum { LISTER, LEAVER, MUTE, SLOW };

#define LEAVER_PAUSE_S 0.05

typedef struct lconn {
  int kind, fd;
  double reopen_at; /* leavers: when to come back */
  const char *src;
  size_t sent, got, need; /* bytes of the request sent; of the answer read and expected */
  char head[4096];
  size_t head_len;
} lconn_t;

typedef struct load {
  int port;
  volatile int stop;
  long answers, refused, connects;
  int epfd;
  lconn_t *conns;
  int n;
} load_t;

static const char *const srcs[] = {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"};
static const char list_req[] = "GET /v1/jobs?limit=500 HTTP/1.1\r\nHost: x\r\n\r\n";
static const char slow_req[] = "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n";

static void lconn_open(load_t *l, lconn_t *c) {
  struct sockaddr_in me = {.sin_family = AF_INET}, sa = {.sin_family = AF_INET};
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, c->src, &me.sin_addr);
  sa.sin_port = htons((uint16_t)l->port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (c->fd < 0 || bind(c->fd, (struct sockaddr *)&me, sizeof me) != 0 ||
      (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS)) {
    if (c->fd >= 0)
      close(c->fd);
    c->fd = -1;
    return;
  }
  c->sent = c->got = c->need = c->head_len = 0;
  l->connects++;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c};
  epoll_ctl(l->epfd, EPOLL_CTL_ADD, c->fd, &ev);
}

static void lconn_close(load_t *l, lconn_t *c) {
  if (c->fd >= 0) {
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
  }
  c->fd = -1;
}

/* Advances one connection as far as it goes without blocking. */
static void lconn_step(load_t *l, lconn_t *c) {
  for (int guard = 0; guard < 64 && c->fd >= 0; guard++) {
    const char *req = c->kind == SLOW ? slow_req : list_req;
    size_t req_len = strlen(req) * (c->kind == MUTE ? 20 : 1);
    if (c->sent < req_len) {
      char buf[sizeof list_req * 20];
      for (int i = 0; i < 20; i++)
        memcpy(buf + i * (sizeof list_req - 1), list_req, sizeof list_req - 1);
      const char *src = c->kind == MUTE ? buf : req;
      ssize_t n = send(c->fd, src + c->sent, req_len - c->sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINPROGRESS || errno == ENOTCONN)
          return;
        lconn_close(l, c);
        return;
      }
      c->sent += (size_t)n;
      if (c->sent == req_len && c->kind == LEAVER) { /* asked, and gone */
        lconn_close(l, c);
        c->reopen_at = raw_now() + LEAVER_PAUSE_S;
        return;
      }
      continue;
    }
    if (c->kind != LISTER)
      return; /* mutes and slow ones hold their connection */
    char buf[65536];
    ssize_t n = recv(c->fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
      lconn_close(l, c);
      lconn_open(l, c);
      return;
    }
    if (n < 0)
      return;
    for (ssize_t i = 0; i < n; i++) {
      if (c->need == 0 && c->head_len < sizeof c->head - 1) { /* still in the head */
        c->head[c->head_len++] = buf[i];
        c->head[c->head_len] = '\0';
        char *he = strstr(c->head, "\r\n\r\n");
        if (he) {
          char *cl = strstr(c->head, "Content-Length: ");
          c->need = cl ? strtoul(cl + 16, NULL, 10) + 1 : 1; /* +1: 0-length bodies */
          if (strncmp(c->head, "HTTP/1.1 503", 12) == 0)
            l->refused++;
          c->got = 1;
        }
        continue;
      }
      c->got++;
    }
    if (c->need && c->got >= c->need) { /* one answer complete: the next request */
      l->answers++;
      c->sent = c->got = c->need = c->head_len = 0;
    }
  }
}

static void *load_main(void *arg) {
  load_t *l = arg;
  struct epoll_event evs[128];
  for (int i = 0; i < l->n; i++)
    lconn_open(l, &l->conns[i]);
  while (!l->stop) {
    int n = epoll_wait(l->epfd, evs, 128, 5);
    for (int i = 0; i < n; i++)
      lconn_step(l, evs[i].data.ptr);
    double now = raw_now();
    for (int i = 0; i < l->n; i++) /* leavers back, and connections that failed to open */
      if (l->conns[i].fd < 0 && now >= l->conns[i].reopen_at)
        lconn_open(l, &l->conns[i]);
  }
  for (int i = 0; i < l->n; i++)
    lconn_close(l, &l->conns[i]);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(p * (n - 1) + 0.5);
  return n ? v[i] : 0;
}

static void test_probes_under_load(void **state) {
  harness_env_t *e = *state;
  coord_proc_t c;
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "load", 3, NULL, NULL);
  char url[128], body[128];
  snprintf(url, sizeof url, "%s/v1/jobs", c.base);
  for (int i = 0; i < NJOBS; i++) {
    http_result_t r;
    int n = snprintf(body, sizeof body, "{\"name\":\"load-%04d\",\"workers\":4}", i);
    harness_http("POST", url, body, (size_t)n, "application/json", NULL, &r);
    assert_int_equal(r.status, 201);
    harness_http_free(&r);
  }

  /* Unloaded: the baseline. */
  double base[50];
  for (int i = 0; i < 50; i++) {
    int st;
    base[i] = raw_get_timed("127.0.0.1", c.port, "/healthz", &st, 5);
    assert_int_equal(st, 200);
  }

  load_t l = {.port = c.port, .n = 400};
  l.epfd = epoll_create1(EPOLL_CLOEXEC);
  l.conns = calloc((size_t)l.n, sizeof *l.conns);
  for (int i = 0; i < l.n; i++) {
    l.conns[i].kind = i < 200 ? LISTER : i < 300 ? LEAVER : i < 350 ? MUTE : SLOW;
    l.conns[i].src = srcs[i % 4];
    l.conns[i].fd = -1;
  }
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, load_main, &l), 0);
  harness_sleep(1.0); /* the load builds up */

  enum { MAXP = 4000 };
  double *hz = calloc(MAXP, sizeof *hz), *rz = calloc(MAXP, sizeof *rz);
  int nh = 0, nr = 0, hz_fail = 0, rz_ok = 0;
  double t0 = harness_now();
  while (harness_now() - t0 < LOAD_S && nh < MAXP) {
    int st;
    hz[nh] = raw_get_timed("127.0.0.1", c.port, "/healthz", &st, 2);
    hz_fail += st != 200;
    nh++;
    rz[nr] = raw_get_timed("127.0.0.1", c.port, "/readyz", &st, 2);
    rz_ok += st == 200;
    nr++;
    harness_sleep(0.01);
  }
  long answers = l.answers;
  double load_s = harness_now() - t0;
  l.stop = 1;
  pthread_join(th, NULL);
  /* Right after the load: the issue saw /healthz unanswered for 20 s here. */
  double after[20], after_max = 0;
  for (int i = 0; i < 20; i++) {
    int st;
    after[i] = raw_get_timed("127.0.0.1", c.port, "/healthz", &st, 5);
    assert_int_equal(st, 200);
    if (after[i] > after_max)
      after_max = after[i];
  }
  double hz50 = pct(hz, nh, 0.5), hz99 = pct(hz, nh, 0.99), hzmax = hz[nh - 1];
  double rz99 = pct(rz, nr, 0.99), b50 = pct(base, 50, 0.5);
  print_message("healthz unloaded p50 %.2f ms; under load (%d probes): p50 %.2f ms p99 %.2f ms "
                "max %.2f ms, %d failed; readyz p99 %.2f ms (%d/%d ready); after the load: max "
                "%.2f ms; load: %ld list answers (%.0f/s), %ld connects\n",
                b50 * 1e3, nh, hz50 * 1e3, hz99 * 1e3, hzmax * 1e3, hz_fail, rz99 * 1e3, rz_ok, nr,
                after_max * 1e3, answers, (double)answers / load_s, l.connects);
  assert_int_equal(hz_fail, 0);
  /* The goal is 100 ms (bench/coordinator measures it: docs/benchmarks.md); the assertion is
   * looser so that other work on a 2-core machine cannot fail it, and still far below what
   * the unprotected server did (probes unanswered for seconds). */
  assert_true(hz99 < 0.500);
  assert_true(rz99 < 0.500);
  assert_true(after_max < 0.100);
  assert_true(answers > 0); /* the listers were served too */

  /* etcd gone: /healthz still answers at once, /readyz says so within 100 ms. */
  assert_int_equal(etcd_fixture_kill(e->fx, 0), 0);
  double down_hz = 0, down_rz = 0;
  int rz_503 = 0;
  for (int i = 0; i < 20; i++) {
    int st;
    double t = raw_get_timed("127.0.0.1", c.port, "/healthz", &st, 5);
    assert_int_equal(st, 200);
    if (t > down_hz)
      down_hz = t;
    t = raw_get_timed("127.0.0.1", c.port, "/readyz", &st, 5);
    rz_503 += st == 503;
    if (t > down_rz)
      down_rz = t;
  }
  print_message("etcd down: healthz max %.2f ms, readyz max %.2f ms (%d/20 answered 503)\n",
                down_hz * 1e3, down_rz * 1e3, rz_503);
  assert_true(down_hz < 0.100);
  assert_true(down_rz < 0.100);
  assert_true(rz_503 >= 19); /* the first may still ride on a ping from before */
  free(hz);
  free(rz);
  free(l.conns);
  close(l.epfd);
  harness_coord_stop(&c, SIGTERM);
}

static int setup(void **state) {
  harness_env_t *e = NULL;
  int rc = harness_env_start(&e);
  *state = e;
  return rc;
}

static int teardown(void **state) {
  harness_env_stop(*state);
  return 0;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_probes_under_load, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
