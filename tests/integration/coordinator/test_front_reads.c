/* The reads the connection front answers itself from the read cache (coordinator/front.c,
 * front_reads.c), against a real etcd and two real coordinators (a leader and a follower), on
 * raw sockets:
 *
 *   - the same bytes: for every cached read (a job, its plan, its groups now and of a given
 *     round, its timeline, the agents, the job list and its pages, an unknown job, a bad
 *     parameter) the front's answer (a plain HTTP/1.1 GET) has the status line, the fields
 *     (Date aside) and the body libmicrohttpd gives for the same request (with a
 *     percent-encoded parameter no endpoint reads, which the front leaves to libmicrohttpd),
 *     also with `Connection: keep-alive` (as browsers send it), and the follower answers
 *     what the leader does (a timeline: the same status; its times are each replica's); the
 *     front did answer them (wagma_read_cache_front_total);
 *   - consistent: a progress record written straight into etcd is in the next GET of the job,
 *     on both coordinators, every time (the read is parked until a sync that started after it
 *     arrived verified the view);
 *   - read your writes through the front: a PATCH and a GET of the job pipelined in one
 *     write, and a GET on a second connection right after the PATCH's answer, both show the
 *     new workers, also on a coordinator with --read-staleness-ms 1000 (a third one), whose
 *     front answers at once: the GET waits for the PATCH libmicrohttpd has in hand;
 *   - pipelined GETs on one connection are answered in order;
 *   - a parked read whose client leaves is counted as abandoned, not answered;
 *   - after writes outside the prefix (which the watch never delivers) reads are still
 *     answered from the cache, not from etcd. */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw_http.h"

#define JOB "fr"
#define NAGENTS 4

typedef struct fixture {
  harness_env_t *env;
  coord_proc_t leader, follower, stale; /* stale: --read-staleness-ms 1000 */
  fake_agent_t agents[NAGENTS];
} fixture_t;

/* ---- raw answers, whole ------------------------------------------------------------------ */

typedef struct answer {
  char *head; /* status line and fields, Date removed, "\r\n" separated */
  char *body;
  size_t body_len;
  int status;
} answer_t;

static void answer_free(answer_t *a) {
  free(a->head);
  free(a->body);
  memset(a, 0, sizeof *a);
}

/* Reads one answer from fd (blocking, SO_RCVTIMEO set by raw_connect); *buf holds what came
 * after it. 0, or -1. */
static int read_answer(int fd, char **buf, size_t *len, answer_t *a) {
  memset(a, 0, sizeof *a);
  size_t cap = *len + 65536;
  char *b = realloc(*buf, cap);
  if (!b)
    return -1;
  *buf = b;
  for (;;) {
    char *end = *len >= 4 ? memmem(b, *len, "\r\n\r\n", 4) : NULL;
    if (end) {
      size_t hl = (size_t)(end - b) + 4;
      const char *cl = strcasestr(b, "\r\nContent-Length: ");
      if (!cl || cl > end)
        return -1;
      size_t bl = strtoul(cl + 18, NULL, 10);
      if (*len >= hl + bl) {
        a->head = calloc(1, hl + 1);
        a->body = malloc(bl + 1);
        if (!a->head || !a->body)
          return -1;
        /* copy the head without its Date field */
        size_t o = 0;
        for (const char *p = b; p < b + hl;) {
          const char *e = memmem(p, (size_t)(b + hl - p), "\r\n", 2);
          size_t n = (size_t)(e - p) + 2;
          if (strncasecmp(p, "Date:", 5) != 0) {
            memcpy(a->head + o, p, n);
            o += n;
          }
          p += n;
        }
        memcpy(a->body, b + hl, bl);
        a->body[bl] = '\0';
        a->body_len = bl;
        a->status = atoi(b + 9);
        memmove(b, b + hl + bl, *len - hl - bl);
        *len -= hl + bl;
        return 0;
      }
    }
    if (*len == cap) {
      cap *= 2;
      if (!(b = realloc(b, cap)))
        return -1;
      *buf = b;
    }
    ssize_t n = recv(fd, b + *len, cap - *len, 0);
    if (n <= 0)
      return -1;
    *len += (size_t)n;
  }
}

enum { PLAIN, VIA_MHD, KEEP_ALIVE };

/* GET path on a fresh connection. VIA_MHD: the same request in a form the front hands to
 * libmicrohttpd (an extra query parameter z=z, percent-encoded, which no endpoint reads);
 * KEEP_ALIVE: with "Connection: keep-alive", as browsers send it. */
static int get(int port, const char *path, int how, answer_t *a) {
  int fd = raw_connect(NULL, port, 10);
  if (fd < 0)
    return -1;
  char req[512];
  int n = snprintf(req, sizeof req, "GET %s%s HTTP/1.1\r\nHost: x\r\n%s\r\n", path,
                   how != VIA_MHD      ? ""
                   : strchr(path, '?') ? "&z=%7A"
                                       : "?z=%7A",
                   how == KEEP_ALIVE ? "Connection: keep-alive\r\n" : "");
  char *buf = NULL;
  size_t len = 0;
  int e = send(fd, req, (size_t)n, MSG_NOSIGNAL) == n ? read_answer(fd, &buf, &len, a) : -1;
  free(buf);
  close(fd);
  return e;
}

static long metric(const coord_proc_t *c, const char *name) {
  answer_t a;
  long v = -1;
  if (get(c->port, "/metrics", PLAIN, &a) != 0)
    return -1;
  char pat[160];
  snprintf(pat, sizeof pat, "\n%s ", name);
  const char *p = strstr(a.body, pat);
  if (p)
    v = strtol(p + strlen(pat), NULL, 10);
  answer_free(&a);
  return v;
}

/* ---- setup ------------------------------------------------------------------------------- */

static int group_setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  *state = f;
  if (!f || harness_env_start(&f->env) != 0)
    return -1;
  const char *eps = etcd_fixture_endpoints(f->env->fx);
  harness_coord_start(&f->leader, eps, "front-a", 3, NULL, NULL);
  harness_sleep(0.5); /* the first one leads */
  harness_coord_start(&f->follower, eps, "front-b", 3, NULL, NULL);
  static const char *const stale_flags[] = {"--read-staleness-ms", "1000", NULL};
  harness_coord_start(&f->stale, eps, "front-c", 3, NULL, stale_flags);
  for (int i = 0; i < NAGENTS; i++) {
    char name[32];
    snprintf(name, sizeof name, "fr-agent-%d", i);
    harness_agent_start(f->env->etcd, &f->agents[i], name, 7100 + i, 5);
  }
  char url[128];
  snprintf(url, sizeof url, "%s/v1/jobs", f->leader.base);
  static const char spec[] = "{\"name\":\"" JOB "\",\"workers\":4,\"min_workers\":2,"
                             "\"max_workers\":4,\"iterations\":100000}";
  http_result_t r;
  harness_http("POST", url, spec, sizeof spec - 1, "application/json", NULL, &r);
  int ok = r.status == 201;
  harness_http_free(&r);
  if (!ok || harness_wait_epoch(f->leader.base, JOB, 1, 20) < 0)
    return -1;
  for (int i = 0; i < NAGENTS; i++)
    harness_progress(f->env->etcd, JOB, f->agents[i].name, 10 + (uint64_t)i, "running", 1.5);
  return 0;
}

static int group_teardown(void **state) {
  fixture_t *f = *state;
  if (f) {
    if (f->stale.pid > 0)
      harness_coord_stop(&f->stale, SIGTERM);
    if (f->follower.pid > 0)
      harness_coord_stop(&f->follower, SIGTERM);
    if (f->leader.pid > 0)
      harness_coord_stop(&f->leader, SIGTERM);
    for (int i = 0; i < NAGENTS; i++)
      if (f->agents[i].ka)
        harness_agent_kill(f->env->etcd, &f->agents[i]);
    harness_env_stop(f->env);
    free(f);
  }
  return 0;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_same_bytes(void **state) {
  fixture_t *f = *state;
  static const char *const paths[] = {
      "/v1/jobs/" JOB,
      "/v1/jobs/" JOB "/plan",
      "/v1/jobs/" JOB "/groups",
      "/v1/jobs/" JOB "/groups?iteration=3",
      "/v1/jobs/" JOB "/events",
      "/v1/agents",
      "/v1/jobs",
      "/v1/jobs?limit=1",
      "/v1/jobs?state=running",
      "/v1/jobs/nope",
      "/v1/jobs/" JOB "/groups?iteration=x",
      "/v1/jobs/nope/plan",
  };
  long front0 = metric(&f->leader, "wagma_read_cache_front_total");
  assert_true(front0 >= 0);
  int nfront = 0;
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    answer_t a, b, c, d;
    /* The view may change between two reads (a sync, the scheduler): try a few times. */
    int same = 0;
    for (int t = 0; t < 20 && !same; t++) {
      assert_int_equal(get(f->leader.port, paths[i], PLAIN, &a), 0);
      assert_int_equal(get(f->leader.port, paths[i], VIA_MHD, &b), 0);
      assert_int_equal(get(f->follower.port, paths[i], PLAIN, &c), 0);
      assert_int_equal(get(f->leader.port, paths[i], KEEP_ALIVE, &d), 0);
      if (strncmp(paths[i], "/v1/jobs/", 9) == 0) /* one job's reads (not the list) */
        nfront += 2;
      /* A timeline's times are each replica's own (when its watch saw the change, or a
       * record's time when rebuilt at start): the follower's is compared by status only. */
      int timeline = strstr(paths[i], "/events") != NULL;
      same = strcmp(a.head, b.head) == 0 && a.body_len == b.body_len &&
             memcmp(a.body, b.body, a.body_len) == 0 && strcmp(a.head, d.head) == 0 &&
             a.body_len == d.body_len && memcmp(a.body, d.body, a.body_len) == 0 &&
             (timeline ? a.status == c.status
                       : strcmp(a.head, c.head) == 0 && a.body_len == c.body_len &&
                             memcmp(a.body, c.body, a.body_len) == 0);
      if (!same && t == 19)
        print_message("%s:\n front: %s%.300s\n libmicrohttpd: %s%.300s\n follower: %s%.300s\n",
                      paths[i], a.head, a.body, b.head, b.body, c.head, c.body);
      answer_free(&a);
      answer_free(&b);
      answer_free(&c);
      answer_free(&d);
      if (!same)
        harness_sleep(0.1);
    }
    assert_true(same);
  }
  /* The plain and keep-alive requests of one job's reads were the front's (hits or waits),
   * the others libmicrohttpd's. */
  long front = metric(&f->leader, "wagma_read_cache_front_total");
  assert_int_equal(front - front0, nfront);
}

/* A write straight into etcd (as an agent's) is in the next read, on either coordinator. */
static void test_consistent(void **state) {
  fixture_t *f = *state;
  for (int i = 0; i < 60; i++) {
    uint64_t it = 10000 + (uint64_t)i;
    harness_progress(f->env->etcd, JOB, f->agents[0].name, it, "running", 1.0);
    const coord_proc_t *c = i % 2 ? &f->follower : &f->leader;
    answer_t a;
    assert_int_equal(get(c->port, "/v1/jobs/" JOB, PLAIN, &a), 0);
    assert_int_equal(a.status, 200);
    char want[64];
    snprintf(want, sizeof want, "\"iteration\":%llu", (unsigned long long)it);
    if (!strstr(a.body, want))
      print_message("read %d (%s) misses %s\n", i, i % 2 ? "follower" : "leader", want);
    assert_non_null(strstr(a.body, want));
    answer_free(&a);
  }
}

/* etcd's revision also moves with writes outside the prefix, which the watch never delivers:
 * a read after one is still answered from the cache (the sync's full check), not from etcd
 * after the cache waited a second for the watch. */
static void test_outside_writes(void **state) {
  fixture_t *f = *state;
  long etcd0 = metric(&f->leader, "wagma_read_cache_total{served=\"etcd\"}");
  assert_true(etcd0 >= 0);
  double worst = 0;
  for (int i = 0; i < 20; i++) {
    char v[32];
    snprintf(v, sizeof v, "%d", i);
    assert_int_equal(wagma_etcd_put(f->env->etcd, "/elsewhere/key", v, strlen(v), 0, NULL), 0);
    answer_t a;
    double t0 = harness_now();
    assert_int_equal(get(f->leader.port, "/v1/jobs/" JOB, PLAIN, &a), 0);
    if (harness_now() - t0 > worst)
      worst = harness_now() - t0;
    assert_int_equal(a.status, 200);
    answer_free(&a);
  }
  print_message("reads after writes outside the prefix: slowest %.1f ms\n", worst * 1e3);
  assert_int_equal(metric(&f->leader, "wagma_read_cache_total{served=\"etcd\"}"), etcd0);
}

/* A PATCH and a GET pipelined in one write; a GET on another connection right after; on a
 * coordinator with consistent reads and on one that answers at once (bounded staleness). */
static void test_read_your_writes(void **state) {
  fixture_t *f = *state;
  for (int k = 0; k < 6; k++) {
    int workers = 3 - k % 2;
    const coord_proc_t *c = k < 2 ? &f->leader : &f->stale;
    char body[64], req[512];
    int bl = snprintf(body, sizeof body, "{\"workers\":%d}", workers);
    int n = snprintf(req, sizeof req,
                     "PATCH /v1/jobs/" JOB " HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: %d\r\n\r\n%s"
                     "GET /v1/jobs/" JOB " HTTP/1.1\r\nHost: x\r\n\r\n",
                     bl, body);
    int fd = raw_connect(NULL, c->port, 10);
    assert_true(fd >= 0);
    /* The PATCH, then (k odd) the GET a moment later, while libmicrohttpd works on the
     * PATCH: the front must not answer it before; or both in one write. */
    int split = k % 2 ? (int)(strstr(req, "GET ") - req) : n;
    assert_int_equal(send(fd, req, (size_t)split, MSG_NOSIGNAL), split);
    if (split < n) {
      usleep(1000);
      assert_int_equal(send(fd, req + split, (size_t)(n - split), MSG_NOSIGNAL), n - split);
    }
    char *buf = NULL;
    size_t len = 0;
    answer_t p, g, h;
    assert_int_equal(read_answer(fd, &buf, &len, &p), 0);
    assert_int_equal(p.status, 200);
    char want[32];
    snprintf(want, sizeof want, "\"workers\":%d", workers);
    assert_non_null(strstr(p.body, want)); /* the PATCH's answer: the job as written */
    assert_int_equal(get(c->port, "/v1/jobs/" JOB, PLAIN, &h), 0); /* another connection */
    assert_int_equal(read_answer(fd, &buf, &len, &g), 0);
    assert_int_equal(g.status, 200);
    assert_non_null(strstr(g.body, want));
    assert_int_equal(h.status, 200);
    assert_non_null(strstr(h.body, want));
    answer_free(&p);
    answer_free(&g);
    answer_free(&h);
    free(buf);
    close(fd);
  }
}

/* Three GETs in one write: three answers, in order (on the coordinator that answers at once). */
static void test_pipelined(void **state) {
  fixture_t *f = *state;
  static const char req[] = "GET /v1/jobs/" JOB "/plan HTTP/1.1\r\nHost: x\r\n\r\n"
                            "GET /v1/jobs/nope HTTP/1.1\r\nHost: x\r\n\r\n"
                            "GET /v1/jobs/" JOB " HTTP/1.1\r\nHost: x\r\n\r\n";
  int fd = raw_connect(NULL, f->stale.port, 10);
  assert_true(fd >= 0);
  assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
  char *buf = NULL;
  size_t len = 0;
  answer_t a[3];
  for (int i = 0; i < 3; i++)
    assert_int_equal(read_answer(fd, &buf, &len, &a[i]), 0);
  assert_int_equal(a[0].status, 200);
  assert_non_null(strstr(a[0].body, "\"members\""));
  assert_null(strstr(a[0].body, "\"spec\""));
  assert_int_equal(a[1].status, 404);
  assert_int_equal(a[2].status, 200);
  assert_non_null(strstr(a[2].body, "\"spec\""));
  for (int i = 0; i < 3; i++)
    answer_free(&a[i]);
  free(buf);
  close(fd);
}

/* Reads parked for a sync whose clients leave at once: counted as abandoned. */
static void test_parked_abandoned(void **state) {
  fixture_t *f = *state;
  long before = metric(&f->leader, "wagma_http_abandoned_total");
  assert_true(before >= 0);
  static const char req[] = "GET /v1/jobs/" JOB " HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 50; i++) {
    int fd = raw_connect(NULL, f->leader.port, 5);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
    close(fd);
  }
  long after = before;
  for (int i = 0; i < 40 && after == before; i++) {
    harness_sleep(0.05);
    after = metric(&f->leader, "wagma_http_abandoned_total");
  }
  print_message("%ld of 50 parked reads abandoned\n", after - before);
  assert_true(after > before);
  answer_t a;
  assert_int_equal(get(f->leader.port, "/v1/jobs/" JOB, PLAIN, &a), 0);
  assert_int_equal(a.status, 200);
  answer_free(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_bytes),       cmocka_unit_test(test_consistent),
      cmocka_unit_test(test_read_your_writes), cmocka_unit_test(test_pipelined),
      cmocka_unit_test(test_parked_abandoned), cmocka_unit_test(test_outside_writes),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
