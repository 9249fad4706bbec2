/* test_events.c — the coordinator's event streams (issue 14) against a real etcd and a real
 * wagma-coordinator with a token, agents faked as leased keys:
 *   - the token: streams and timelines refused without it (401), served with it;
 *   - order: a job's stream opens with a snapshot, then its timeline (running, epoch 1, scaled,
 *     epoch 2 with the member that left and why, stopped) and 200 progress reports of one
 *     agent, every one, in the order they were written, revisions never going back; heartbeats
 *     while nothing happens; the timeline list (JSON) says the same;
 *   - a slow client (a stream nobody reads) is dropped once its buffer is full, while /healthz
 *     keeps answering fast and a reading stream gets every event;
 *   - wagmactl watch: --json events until the job ends, exit 0 (succeeded) / 5 (stopped);
 *   - streams closed by their clients are not counted as dropped;
 *   - a snapshot bigger than --sse-client-buffer is sent (a second coordinator, 4096 bytes),
 *     and the events after it;
 *   - with etcd frozen (SIGSTOP), streams of unknown jobs do not hold up /healthz, and are
 *     answered 503 without etcd.
 * Raw sockets for the streams (tests/integration/coordinator/raw_http.c), stopped by PID. */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "process.h"
#include "raw_http.h"

#define TOKEN "s3cret-token"

typedef struct fixture {
  harness_env_t *env;
  coord_proc_t coord;
  coord_proc_t small; /* test_snapshot_over_buffer's, with a 4096-byte client buffer */
  pid_t frozen;       /* etcd while test_frozen_etcd has it stopped */
} fixture_t;

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  *state = f;
  if (harness_env_start(&f->env) != 0)
    return -1;
  const char *extra[] = {"--sse-heartbeat-ms", "300", "--sse-client-buffer", "65536", NULL};
  harness_coord_start(&f->coord, etcd_fixture_endpoints(f->env->fx), "events", 3, TOKEN, extra);
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  if (f->frozen > 0) /* always resume etcd */
    kill(f->frozen, SIGCONT);
  if (f->small.pid > 0)
    harness_coord_stop(&f->small, SIGTERM);
  if (f->coord.pid > 0)
    harness_coord_stop(&f->coord, SIGTERM);
  harness_env_stop(f->env);
  free(f);
  return 0;
}

/* ---- a stream on a raw socket ------------------------------------------------------------ */

typedef struct sse {
  int fd;
  char buf[1 << 20];
  size_t len, off; /* parsed up to off */
  int status;
  int comments;
  char last_id[128]; /* the id of the last event returned */
} sse_t;

/* Opens a stream; last_id (may be NULL) goes as Last-Event-ID. */
static int sse_open_from(sse_t *s, int port, const char *path, const char *token, int rcvbuf,
                         const char *last_id) {
  memset(s, 0, sizeof *s);
  s->fd = raw_connect(NULL, port, 5);
  if (s->fd < 0)
    return -1;
  if (rcvbuf > 0)
    setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  char req[768];
  int n =
      snprintf(req, sizeof req,
               "GET %s HTTP/1.0\r\nHost: x\r\nAccept: text/event-stream\r\n%s%s%s%s%s%s\r\n", path,
               token ? "Authorization: Bearer " : "", token ? token : "", token ? "\r\n" : "",
               last_id ? "Last-Event-ID: " : "", last_id ? last_id : "", last_id ? "\r\n" : "");
  return send(s->fd, req, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

static int sse_open(sse_t *s, int port, const char *path, const char *token, int rcvbuf) {
  return sse_open_from(s, port, path, token, rcvbuf, NULL);
}

/* Reads what is there within timeout_s (0: only what is ready). 0 = the server closed. */
static ssize_t sse_fill(sse_t *s, double timeout_s) {
  struct pollfd p = {.fd = s->fd, .events = POLLIN};
  if (poll(&p, 1, (int)(timeout_s * 1000)) <= 0)
    return -1;
  if (s->len == sizeof s->buf) { /* keep the unparsed tail */
    memmove(s->buf, s->buf + s->off, s->len - s->off);
    s->len -= s->off;
    s->off = 0;
  }
  ssize_t n = recv(s->fd, s->buf + s->len, sizeof s->buf - s->len, 0);
  if (n > 0)
    s->len += (size_t)n;
  return n;
}

/* The next event (name, data; HTTP/1.0, so the body is the stream itself, not chunked),
 * waiting up to timeout_s. 1 = got one, 0 = none in time, -1 = closed. */
static int sse_next(sse_t *s, char *name, size_t nlen, char **data, double timeout_s) {
  double t0 = harness_now();
  for (;;) {
    if (!s->status && s->len) {
      char *end = memmem(s->buf, s->len, "\r\n\r\n", 4);
      if (end) {
        s->status = atoi(s->buf + 9);
        s->off = (size_t)(end + 4 - s->buf);
      }
    }
    /* an event: lines up to a blank line */
    if (s->status == 200) {
      char *p = s->buf + s->off, *lim = s->buf + s->len;
      char *blank = memmem(p, (size_t)(lim - p), "\n\n", 2);
      if (blank) {
        name[0] = '\0';
        *data = NULL;
        size_t dl = 0;
        char *line = p;
        while (line < blank + 1) {
          char *nl = memchr(line, '\n', (size_t)(blank + 1 - line));
          size_t ll = (size_t)(nl - line);
          if (ll && line[ll - 1] == '\r')
            ll--;
          if (ll > 7 && memcmp(line, "event: ", 7) == 0) {
            snprintf(name, nlen, "%.*s", (int)(ll - 7), line + 7);
          } else if (ll > 4 && memcmp(line, "id: ", 4) == 0) {
            snprintf(s->last_id, sizeof s->last_id, "%.*s", (int)(ll - 4), line + 4);
          } else if (ll >= 6 && memcmp(line, "data: ", 6) == 0) {
            *data = realloc(*data, dl + ll + 2);
            memcpy(*data + dl, line + 6, ll - 6);
            dl += ll - 6;
            (*data)[dl] = '\0';
          } else if (ll && line[0] == ':') {
            s->comments++;
          }
          line = nl + 1;
        }
        s->off = (size_t)(blank + 2 - s->buf);
        if (*data)
          return 1;
        continue; /* a comment or framing only */
      }
    }
    double left = timeout_s - (harness_now() - t0);
    if (left <= 0)
      return 0;
    ssize_t n = sse_fill(s, left);
    if (n == 0)
      return -1;
  }
}

/* Waits for an event named want (others skipped; progress and timeline kept in order by the
 * caller when it wants them). Returns its parsed data or NULL. */
static json_t *sse_expect(sse_t *s, const char *want, double timeout_s) {
  double t0 = harness_now();
  char name[64];
  char *data = NULL;
  while (harness_now() - t0 < timeout_s) {
    int r = sse_next(s, name, sizeof name, &data, timeout_s - (harness_now() - t0));
    if (r <= 0)
      return NULL;
    if (strcmp(name, want) == 0) {
      json_t *v = json_loads(data, 0, NULL);
      free(data);
      return v;
    }
    free(data);
  }
  return NULL;
}

static int status_of(int port, const char *path, const char *token) {
  sse_t *s = malloc(sizeof *s);
  char name[64];
  char *data = NULL;
  assert_int_equal(sse_open(s, port, path, token, 0), 0);
  sse_next(s, name, sizeof name, &data, 2);
  free(data);
  int st = s->status;
  close(s->fd);
  free(s);
  return st;
}

static json_t *call(fixture_t *f, const char *method, const char *path, const char *body,
                    int want) {
  char url[256];
  http_result_t r;
  snprintf(url, sizeof url, "%s%s", f->coord.base, path);
  harness_http(method, url, body, body ? strlen(body) : 0, body ? "application/json" : NULL, TOKEN,
               &r);
  if (r.status != want)
    fail_msg("%s %s: %ld, want %d: %s", method, path, r.status, want, r.body);
  json_t *v = json_loads(r.body, 0, NULL);
  harness_http_free(&r);
  return v;
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Read-your-writes: a job's stream opened right after the POST that created it finds the job
 * (the stream used to answer 404 when the watch had not brought the job into the view yet, seen
 * once under load in CI). */
static void test_stream_right_after_create(void **state) {
  fixture_t *f = *state;
  for (int i = 0; i < 20; i++) {
    char body[96], path[96];
    snprintf(body, sizeof body, "{\"name\":\"fresh%d\",\"workers\":9}", i);
    snprintf(path, sizeof path, "/v1/jobs/fresh%d/events", i);
    json_decref(call(f, "POST", "/v1/jobs", body, 201));
    assert_int_equal(status_of(f->coord.port, path, TOKEN), 200);
  }
}

static void test_token(void **state) {
  fixture_t *f = *state;
  json_decref(call(f, "POST", "/v1/jobs", "{\"name\":\"tok\",\"workers\":9}", 201));
  assert_int_equal(status_of(f->coord.port, "/v1/jobs/tok/events", NULL), 401);
  assert_int_equal(status_of(f->coord.port, "/v1/jobs/tok/events", "wrong"), 401);
  assert_int_equal(status_of(f->coord.port, "/v1/events", NULL), 401);
  assert_int_equal(status_of(f->coord.port, "/v1/jobs/tok/events", TOKEN), 200);
  assert_int_equal(status_of(f->coord.port, "/v1/events", TOKEN), 200);
  assert_int_equal(status_of(f->coord.port, "/v1/jobs/nope/events", TOKEN), 404);
  /* The timeline as JSON: the same rule. */
  char url[256];
  http_result_t r;
  snprintf(url, sizeof url, "%s/v1/jobs/tok/events", f->coord.base);
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 401);
  harness_http_free(&r);
  json_t *v = call(f, "GET", "/v1/jobs/tok/events", NULL, 200);
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(json_object_get(v, "events"), 0), "type")),
      "submitted");
  json_decref(v);
  /* Reads stay open (docs/api.md): GET of the job needs no token. */
  snprintf(url, sizeof url, "%s/v1/jobs/tok", f->coord.base);
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  harness_http_free(&r);
  json_decref(call(f, "DELETE", "/v1/jobs/tok", NULL, 200));
}

static void test_order(void **state) {
  fixture_t *f = *state;
  wagma_etcd_t *etcd = f->env->etcd;
  sse_t *s = malloc(sizeof *s), *all = malloc(sizeof *all);
  json_decref(call(f, "POST", "/v1/jobs",
                   "{\"name\":\"ord\",\"workers\":2,\"min_workers\":2,\"max_workers\":3,"
                   "\"group_size\":2}",
                   201));
  assert_int_equal(sse_open(s, f->coord.port, "/v1/jobs/ord/events", TOKEN, 0), 0);
  assert_int_equal(sse_open(all, f->coord.port, "/v1/events", TOKEN, 0), 0);
  json_t *snap = sse_expect(s, "snapshot", 5);
  assert_non_null(snap);
  assert_string_equal(json_string_value(json_object_get(json_object_get(snap, "job"), "id")),
                      "ord");
  json_decref(snap);
  snap = sse_expect(all, "snapshot", 5);
  assert_non_null(snap);
  json_decref(snap);

  /* Heartbeats while nothing happens. */
  char name[64];
  char *data = NULL;
  assert_int_equal(sse_next(s, name, sizeof name, &data, 1.0), 0);
  assert_true(s->comments >= 2);

  fake_agent_t a0, a1;
  harness_agent_start(etcd, &a0, "a0", 7100, 2);
  harness_agent_start(etcd, &a1, "a1", 7101, 2);
  assert_true(harness_wait_epoch(f->coord.base, "ord", 1, 10) >= 0);
  for (int i = 1; i <= 200; i++)
    harness_progress(etcd, "ord", "a0", (uint64_t)i, "running", 1.0 / i);
  json_decref(call(f, "PATCH", "/v1/jobs/ord", "{\"workers\":3}", 200));
  harness_agent_kill(etcd, &a1);
  assert_true(harness_wait_epoch(f->coord.base, "ord", 2, 10) >= 0);
  json_decref(call(f, "DELETE", "/v1/jobs/ord", NULL, 200));

  /* Everything in order: the timeline entries as listed, a0's 200 reports one by one. */
  const char *want[] = {"state:pending->running", "epoch:1", "scaled", "epoch:2",
                        "state:running->stopped"};
  int next_tl = 0, next_it = 1;
  long long last_rev = 0;
  double t0 = harness_now();
  while (next_tl < 5 && harness_now() - t0 < 15) {
    int r = sse_next(s, name, sizeof name, &data, 15 - (harness_now() - t0));
    assert_int_equal(r, 1);
    json_t *d = json_loads(data, 0, NULL);
    free(data);
    assert_non_null(d);
    if (strcmp(name, "progress") == 0 &&
        strcmp(json_string_value(json_object_get(d, "agent")), "a0") == 0) {
      long long it =
          json_integer_value(json_object_get(json_object_get(d, "progress"), "iteration"));
      if (it != next_it)
        fail_msg("progress of a0: iteration %lld, want %d", it, next_it);
      next_it++;
    } else if (strcmp(name, "timeline") == 0) {
      long long rev = json_integer_value(json_object_get(d, "revision"));
      assert_true(rev >= last_rev);
      last_rev = rev;
      const char *type = json_string_value(json_object_get(d, "type"));
      char got[96];
      if (strcmp(type, "state") == 0)
        snprintf(got, sizeof got, "state:%s->%s", json_string_value(json_object_get(d, "from")),
                 json_string_value(json_object_get(d, "to")));
      else if (strcmp(type, "epoch") == 0)
        snprintf(got, sizeof got, "epoch:%lld", json_integer_value(json_object_get(d, "epoch")));
      else
        snprintf(got, sizeof got, "%s", type);
      print_message("timeline: %s (%s)\n", got, json_string_value(json_object_get(d, "message")));
      if (strcmp(got, want[next_tl]) != 0)
        fail_msg("timeline entry %d: %s, want %s", next_tl, got, want[next_tl]);
      if (strcmp(got, "epoch:2") == 0) { /* who left, and why */
        json_t *left = json_array_get(json_object_get(d, "left"), 0);
        assert_string_equal(json_string_value(json_object_get(left, "agent")), "a1");
        assert_non_null(strstr(json_string_value(json_object_get(left, "reason")), "registration"));
      }
      next_tl++;
    }
    json_decref(d);
  }
  assert_int_equal(next_tl, 5);
  assert_int_equal(next_it, 201);
  /* The all-jobs stream saw the job change state, without the progress reports. */
  int jobs = 0, progress = 0;
  while (sse_next(all, name, sizeof name, &data, 0.5) == 1) {
    jobs += strcmp(name, "job") == 0;
    progress += strcmp(name, "progress") == 0;
    free(data);
  }
  assert_true(jobs >= 3);
  assert_int_equal(progress, 0);
  /* The timeline list says the same. */
  json_t *v = call(f, "GET", "/v1/jobs/ord/events", NULL, 200);
  assert_int_equal(json_array_size(json_object_get(v, "events")), 6); /* submitted + the 5 */
  json_decref(v);
  close(s->fd);
  close(all->fd);
  free(s);
  free(all);
  harness_agent_kill(etcd, &a0);
}

static long metric(fixture_t *f, const char *name) {
  char url[256];
  http_result_t r;
  snprintf(url, sizeof url, "%s/metrics", f->coord.base);
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  char pat[160];
  snprintf(pat, sizeof pat, "\n%s ", name);
  const char *p = strstr(r.body, pat);
  long v = p ? strtol(p + strlen(pat), NULL, 10) : -1;
  harness_http_free(&r);
  return v;
}

/* One Txn of 100 progress reports of job slow (padded errors make each event ~700 bytes). */
static void burst(wagma_etcd_t *etcd, int round) {
  char keys[100][96], vals[100][900];
  wagma_etcd_op_t ops[100];
  char pad[512];
  memset(pad, 'x', sizeof pad - 1);
  pad[sizeof pad - 1] = '\0';
  for (int i = 0; i < 100; i++) {
    snprintf(keys[i], sizeof keys[i], "/wagma/jobs/slow/progress/p%03d", i);
    snprintf(vals[i], sizeof vals[i],
             "{\"state\":\"running\",\"epoch\":0,\"iteration\":%d,\"error\":\"%s\"}", round, pad);
    ops[i] = (wagma_etcd_op_t){
        .type = WAGMA_ETCD_OP_PUT, .key = keys[i], .value = vals[i], .value_len = strlen(vals[i])};
  }
  assert_int_equal(wagma_etcd_txn(etcd, NULL, 0, ops, 100, NULL, 0, NULL), 0);
}

static void test_slow_client(void **state) {
  fixture_t *f = *state;
  sse_t *slow = malloc(sizeof *slow), *fast = malloc(sizeof *fast);
  json_decref(call(f, "POST", "/v1/jobs", "{\"name\":\"slow\",\"workers\":9}", 201));
  /* the earlier tests' streams are closed by their clients; the server may count one a little
   * longer (under load, or until its next write there): give them a moment, then take both
   * baselines (a leftover dropped meanwhile must not count as the slow stream's drop) */
  long open0 = metric(f, "wagma_event_streams");
  for (double t0 = harness_now(); open0 > 0 && harness_now() - t0 < 1;) {
    proc_sleep(0.05);
    open0 = metric(f, "wagma_event_streams");
  }
  long dropped0 = metric(f, "wagma_event_streams_dropped_total");
  open0 = metric(f, "wagma_event_streams");
  assert_true(dropped0 >= 0 && open0 >= 0);
  /* A stream that never reads (a small receive window), and one that reads everything. */
  assert_int_equal(sse_open(slow, f->coord.port, "/v1/jobs/slow/events", TOKEN, 4096), 0);
  assert_int_equal(sse_open(fast, f->coord.port, "/v1/jobs/slow/events", TOKEN, 0), 0);
  json_t *snap = sse_expect(fast, "snapshot", 5);
  assert_non_null(snap);
  json_decref(snap);
  assert_int_equal(metric(f, "wagma_event_streams"), open0 + 2);
  double worst = 0;
  int rounds = 0, got = 0;
  long dropped = dropped0;
  char name[64];
  char *data = NULL;
  for (; rounds < 300 && dropped == dropped0; rounds++) {
    burst(f->env->etcd, rounds);
    int st;
    double dt = raw_get_timed(NULL, f->coord.port, "/healthz", &st, 5);
    assert_int_equal(st, 200);
    if (dt > worst)
      worst = dt;
    /* drain the reader until it has been quiet for 0.1 s, so that it keeps up even when
     * other work slows this process down (it must not be the one dropped) */
    while (sse_next(fast, name, sizeof name, &data, 0.1) == 1) {
      got += strcmp(name, "progress") == 0;
      free(data);
    }
    dropped = metric(f, "wagma_event_streams_dropped_total");
  }
  print_message("slow stream dropped after %d bursts of 100 events; /healthz worst %.1f ms\n",
                rounds, worst * 1e3);
  assert_true(dropped >= dropped0 + 1); /* an earlier test's leftover stream may go too */
  assert_true(worst < 0.5);
  /* The reader was not held back: it gets every report written. */
  double t0 = harness_now();
  while (got < rounds * 100 && harness_now() - t0 < 10) {
    if (sse_next(fast, name, sizeof name, &data, 1) == 1) {
      got += strcmp(name, "progress") == 0;
      free(data);
    }
  }
  assert_int_equal(got, rounds * 100);
  /* The dropped stream is gone from the server's count. Streams of earlier tests may close
   * meanwhile (the server notices a client that left at its next write), so the count can
   * only fall below open0 + 1, never stay at open0 + 2. */
  long open = -1;
  for (t0 = harness_now(); harness_now() - t0 < 5 && !(open >= 0 && open <= open0 + 1);
       harness_sleep(0.1))
    open = metric(f, "wagma_event_streams");
  assert_true(open >= 1 && open <= open0 + 1);
  close(slow->fd);
  close(fast->fd);
  free(slow);
  free(fast);
}

/* wagmactl watch --json until the job ends: 0 when it succeeded, 5 when it was stopped. */
static int run_watch(fixture_t *f, const char *job, const char *log) {
  const char *argv[] = {WAGMACTL_BIN, "--server", f->coord.base, "--token", TOKEN,
                        "--json",     "watch",    job,           NULL};
  return proc_spawn(argv, log, NULL);
}

/* Waits (up to timeout_s) until file path has a whole line: the watch's first event (its
 * snapshot) came, so it follows the stream. 1 when it did. */
static int wait_first_line(const char *path, double timeout_s) {
  for (double waited = 0; waited < timeout_s; waited += 0.05) {
    FILE *fp = fopen(path, "r");
    int c, has = 0;
    while (fp && !has && (c = fgetc(fp)) != EOF)
      has = c == '\n';
    if (fp)
      fclose(fp);
    if (has)
      return 1;
    usleep(50 * 1000);
  }
  return 0;
}

static void test_watch(void **state) {
  fixture_t *f = *state;
  wagma_etcd_t *etcd = f->env->etcd;
  char log[256], log2[256];
  snprintf(log, sizeof log, "/tmp/wagma-watch-%d.log", (int)getpid());
  snprintf(log2, sizeof log2, "/tmp/wagma-watch2-%d.log", (int)getpid());
  unlink(log);
  unlink(log2);
  json_decref(
      call(f, "POST", "/v1/jobs", "{\"name\":\"w1\",\"workers\":1,\"iterations\":10}", 201));
  json_decref(call(f, "POST", "/v1/jobs", "{\"name\":\"w2\",\"workers\":5}", 201));
  pid_t p1 = run_watch(f, "w1", log), p2 = run_watch(f, "w2", log2);
  assert_true(p1 > 0 && p2 > 0);
  fake_agent_t a;
  harness_agent_start(etcd, &a, "wa", 7200, 2);
  assert_true(harness_wait_epoch(f->coord.base, "w1", 1, 10) >= 0);
  /* the watch must follow the stream before the reports: a report written before it connected
   * is in its snapshot, not an event (a loaded machine starts it late) */
  assert_true(wait_first_line(log, 10));
  harness_progress(etcd, "w1", "wa", 5, "running", 0.5);
  harness_progress(etcd, "w1", "wa", 10, "done", 0.1);
  int st = proc_wait(p1, 15);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  json_decref(call(f, "DELETE", "/v1/jobs/w2", NULL, 200));
  st = proc_wait(p2, 15);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 5);
  /* The --json lines: the snapshot first, a0's reports, the end. */
  FILE *fp = fopen(log, "r");
  assert_non_null(fp);
  char line[65536];
  int n = 0, progress = 0, succeeded = 0;
  while (fgets(line, sizeof line, fp)) {
    json_t *v = json_loads(line, 0, NULL);
    assert_non_null(v);
    const char *ev = json_string_value(json_object_get(v, "event"));
    if (n++ == 0)
      assert_string_equal(ev, "snapshot");
    progress += strcmp(ev, "progress") == 0;
    json_t *d = json_object_get(v, "data");
    succeeded |= strcmp(ev, "timeline") == 0 && json_string_value(json_object_get(d, "to")) &&
                 strcmp(json_string_value(json_object_get(d, "to")), "succeeded") == 0;
    json_decref(v);
  }
  fclose(fp);
  assert_int_equal(progress, 2);
  assert_true(succeeded);
  unlink(log);
  unlink(log2);
  harness_agent_kill(etcd, &a);
}

/* A stream that reconnects with Last-Event-ID gets the events it missed, in order, and no
 * snapshot; an id this server does not know (another replica's, an earlier view's) gets a
 * snapshot. */
static void test_resume(void **state) {
  fixture_t *f = *state;
  json_decref(call(f, "POST", "/v1/jobs", "{\"name\":\"res\",\"workers\":2}", 201));
  sse_t *s = malloc(sizeof *s);
  char name[64], id1[128];
  char *data = NULL;
  assert_int_equal(sse_open(s, f->coord.port, "/v1/jobs/res/events", TOKEN, 0), 0);
  json_t *snap = sse_expect(s, "snapshot", 5);
  assert_non_null(snap);
  json_decref(snap);
  for (int it = 1; it <= 3; it++)
    harness_progress_epoch(f->env->etcd, "res", "resumer", 0, (uint64_t)it, "running", 1.0);
  for (int it = 1; it <= 3; it++) {
    json_t *p = sse_expect(s, "progress", 5);
    assert_non_null(p);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(p, "progress"), "iteration")), it);
    json_decref(p);
    if (it == 1)
      snprintf(id1, sizeof id1, "%s", s->last_id);
  }
  close(s->fd);
  for (int it = 4; it <= 5; it++)
    harness_progress_epoch(f->env->etcd, "res", "resumer", 0, (uint64_t)it, "running", 1.0);
  harness_sleep(0.3); /* in the coordinator's view */
  assert_int_equal(sse_open_from(s, f->coord.port, "/v1/jobs/res/events", TOKEN, 0, id1), 0);
  for (int it = 2; it <= 5; it++) {
    assert_int_equal(sse_next(s, name, sizeof name, &data, 5), 1);
    if (strcmp(name, "progress") != 0)
      fail_msg("resumed after %s: got %s, want the progress of iteration %d", id1, name, it);
    json_t *p = json_loads(data, 0, NULL);
    free(data);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(p, "progress"), "iteration")), it);
    json_decref(p);
  }
  close(s->fd);
  /* not an id of this server's: a snapshot */
  assert_int_equal(sse_open_from(s, f->coord.port, "/v1/jobs/res/events", TOKEN, 0, "5.3.0badc0de"),
                   0);
  assert_int_equal(sse_next(s, name, sizeof name, &data, 5), 1);
  free(data);
  assert_string_equal(name, "snapshot");
  close(s->fd);
  free(s);
}

/* Streams whose clients close them are not counted as dropped (only those that read too
 * slowly are): wagma_event_streams falls back once the heartbeat finds them gone, and
 * wagma_event_streams_dropped_total stays where it was. */
static void test_left_not_dropped(void **state) {
  fixture_t *f = *state;
  sse_t *s = malloc(4 * sizeof *s);
  json_decref(call(f, "POST", "/v1/jobs", "{\"name\":\"lv\",\"workers\":9}", 201));
  long open0 = metric(f, "wagma_event_streams");
  for (double t0 = harness_now(); open0 > 0 && harness_now() - t0 < 2;) { /* earlier tests' */
    harness_sleep(0.05);
    open0 = metric(f, "wagma_event_streams");
  }
  long dropped0 = metric(f, "wagma_event_streams_dropped_total");
  assert_true(open0 >= 0 && dropped0 >= 0);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(
        sse_open(&s[i], f->coord.port, i % 2 ? "/v1/events" : "/v1/jobs/lv/events", TOKEN, 0), 0);
    json_t *snap = sse_expect(&s[i], "snapshot", 5);
    assert_non_null(snap);
    json_decref(snap);
  }
  assert_int_equal(metric(f, "wagma_event_streams"), open0 + 4);
  harness_sleep(0.2); /* the streams are idle (suspended) */
  for (int i = 0; i < 4; i++)
    close(s[i].fd);
  long open = -1;
  for (double t0 = harness_now(); harness_now() - t0 < 5 && open != open0; harness_sleep(0.1))
    open = metric(f, "wagma_event_streams");
  assert_int_equal(open, open0);
  assert_int_equal(metric(f, "wagma_event_streams_dropped_total"), dropped0);
  free(s);
}

/* A snapshot bigger than --sse-client-buffer is sent, then the events after it (the stream
 * used to be dropped at once, before its client could read anything). */
static void test_snapshot_over_buffer(void **state) {
  fixture_t *f = *state;
  const char *extra[] = {"--sse-heartbeat-ms", "300", "--sse-client-buffer", "4096", NULL};
  for (int i = 0; i < 24; i++) {
    char body[96];
    snprintf(body, sizeof body, "{\"name\":\"big%02d\",\"workers\":9}", i);
    json_decref(call(f, "POST", "/v1/jobs", body, 201));
  }
  /* a replica started now: its view holds every job once the last one's stream opens */
  harness_coord_start(&f->small, etcd_fixture_endpoints(f->env->fx), "events-small", 3, TOKEN,
                      extra);
  assert_int_equal(status_of(f->small.port, "/v1/jobs/big23/events", TOKEN), 200);
  sse_t *s = malloc(sizeof *s);
  char name[64];
  char *data = NULL;
  assert_int_equal(sse_open(s, f->small.port, "/v1/events", TOKEN, 0), 0);
  assert_int_equal(sse_next(s, name, sizeof name, &data, 5), 1);
  assert_string_equal(name, "snapshot");
  print_message("snapshot of %zu bytes, client buffer 4096\n", strlen(data));
  assert_true(strlen(data) > 4096);
  json_t *snap = json_loads(data, 0, NULL);
  free(data);
  assert_true(json_array_size(json_object_get(snap, "jobs")) >= 24);
  json_decref(snap);
  /* The events after it come, and the client is not dropped. */
  json_decref(call(f, "POST", "/v1/jobs", "{\"name\":\"bigafter\",\"workers\":9}", 201));
  int seen = 0;
  for (double t0 = harness_now(); !seen && harness_now() - t0 < 5;) {
    json_t *ev = sse_expect(s, "job", 5 - (harness_now() - t0));
    assert_non_null(ev);
    seen = strcmp(json_string_value(json_object_get(ev, "id")), "bigafter") == 0;
    json_decref(ev);
  }
  assert_true(seen);
  /* A job's stream there too. */
  sse_t *j = malloc(sizeof *j);
  assert_int_equal(sse_open(j, f->small.port, "/v1/jobs/bigafter/events", TOKEN, 0), 0);
  snap = sse_expect(j, "snapshot", 5);
  assert_non_null(snap);
  json_decref(snap);
  close(j->fd);
  free(j);
  close(s->fd);
  free(s);
  harness_coord_stop(&f->small, SIGTERM);
  f->small.pid = 0;
}

/* With etcd frozen, streams of jobs the view does not know (each waits for a sync of the view
 * that cannot come) hold none of libmicrohttpd's threads: /healthz answers at once
 * throughout, and the streams get 503 (Retry-After) within about the sync wait, without etcd. */
static void test_frozen_etcd(void **state) {
  fixture_t *f = *state;
  enum { N = 20 };
  int fds[N];
  pid_t etcd = etcd_fixture_pid(f->env->fx, 0);
  assert_true(etcd > 0);
  assert_int_equal(status_of(f->coord.port, "/v1/jobs/nosuch/events", TOKEN), 404);
  assert_int_equal(kill(etcd, SIGSTOP), 0);
  f->frozen = etcd;
  for (int i = 0; i < N; i++) {
    char req[256];
    fds[i] = raw_connect(NULL, f->coord.port, 10);
    assert_true(fds[i] >= 0);
    int n = snprintf(req, sizeof req,
                     "GET /v1/jobs/nosuch%d/events HTTP/1.0\r\nHost: x\r\n"
                     "Accept: text/event-stream\r\nAuthorization: Bearer %s\r\n\r\n",
                     i, TOKEN);
    assert_int_equal(send(fds[i], req, (size_t)n, MSG_NOSIGNAL), n);
  }
  double worst = 0;
  for (double t0 = harness_now(); harness_now() - t0 < 3;) {
    int st = 0;
    double dt = raw_get_timed(NULL, f->coord.port, "/healthz", &st, 5);
    if (st != 200)
      dt = 99;
    if (dt > worst)
      worst = dt;
    harness_sleep(0.05);
  }
  print_message("etcd frozen, %d streams of unknown jobs: /healthz worst %.1f ms\n", N,
                worst * 1e3);
  assert_true(worst < 1.0);
  /* Each stream is answered, still without etcd: 503, retry. */
  for (int i = 0; i < N; i++) {
    char buf[2048];
    size_t len = 0;
    for (double t0 = harness_now(); len < sizeof buf - 1 && harness_now() - t0 < 5;) {
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      if (poll(&p, 1, 100) <= 0)
        continue;
      ssize_t n = recv(fds[i], buf + len, sizeof buf - 1 - len, 0);
      if (n <= 0)
        break;
      len += (size_t)n;
    }
    buf[len] = '\0';
    if (strncmp(buf, "HTTP/1.", 7) != 0 || atoi(buf + 9) != 503 || !strstr(buf, "Retry-After: 1"))
      fail_msg("stream %d: got \"%.80s\", want 503 with Retry-After", i, buf);
    close(fds[i]);
  }
  assert_int_equal(kill(etcd, SIGCONT), 0);
  f->frozen = 0;
  /* etcd back: an unknown job's stream is 404 again */
  int st = 0;
  for (double t0 = harness_now(); st != 404 && harness_now() - t0 < 15; harness_sleep(0.2))
    st = status_of(f->coord.port, "/v1/jobs/nosuch/events", TOKEN);
  assert_int_equal(st, 404);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_token),
      cmocka_unit_test(test_stream_right_after_create),
      cmocka_unit_test(test_left_not_dropped),
      cmocka_unit_test(test_order),
      cmocka_unit_test(test_slow_client),
      cmocka_unit_test(test_watch),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_snapshot_over_buffer),
      cmocka_unit_test(test_frozen_etcd),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
