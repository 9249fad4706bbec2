/* Integration tests of the request target against a real wagma-coordinator (real etcd from
 * tests/support, the coordinator started and stopped by PID): requests are written on raw
 * sockets, byte for byte, since an HTTP client library would refuse or normalise them (raw NUL
 * bytes, dot segments, %00).
 *
 * What must hold: a target that decodes to a NUL (%00) or holds a raw NUL, a control
 * character, a malformed escape or an encoded '/' is answered 400 with the JSON error body and
 * reaches no handler (DELETE /v1/jobs/nultest%00/../../anything must not stop job nultest);
 * a path that is not exactly a route (dot segments, empty segments, trailing junk) is 404;
 * the connection stays usable after a refused request; the metrics do not count a refused
 * request under the route its cut-short path would have named. */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

typedef struct fixture {
  harness_env_t *env;
  coord_proc_t coord;
} fixture_t;

static int group_setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  *state = f;
  if (!f || harness_env_start(&f->env) != 0)
    return -1;
  harness_coord_start(&f->coord, etcd_fixture_endpoints(f->env->fx), "paths", 3, NULL, NULL);
  return 0;
}

static int group_teardown(void **state) {
  fixture_t *f = *state;
  if (f) {
    if (f->coord.pid > 0)
      harness_coord_stop(&f->coord, SIGTERM);
    harness_env_stop(f->env);
    free(f);
  }
  return 0;
}

/* One answer parsed from the raw bytes: status 0 when the server closed without answering. */
typedef struct raw_answer {
  int status;
  char body[2048];
} raw_answer_t;

/* Writes len bytes (may hold NULs) to the coordinator and reads until it closes (10 s
 * deadline). Fills up to max answers in order; returns how many came. */
static int raw_exchange(int port, const char *bytes, size_t len, raw_answer_t *answers, int max) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  for (size_t off = 0; off < len;) {
    ssize_t n = send(fd, bytes + off, len - off, MSG_NOSIGNAL);
    if (n <= 0)
      break;
    off += (size_t)n;
  }
  static char buf[1 << 16];
  size_t got = 0;
  for (;;) {
    ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
    if (got == sizeof buf - 1)
      break;
  }
  close(fd);
  buf[got] = '\0';
  /* Split into answers: status line, headers, Content-Length bytes of body. */
  int count = 0;
  const char *p = buf, *end = buf + got;
  while (count < max && end - p > 12 && strncmp(p, "HTTP/1.", 7) == 0) {
    raw_answer_t *a = &answers[count++];
    a->status = atoi(p + 9);
    const char *hdr_end = strstr(p, "\r\n\r\n");
    if (!hdr_end)
      break;
    size_t clen = 0;
    const char *cl = strcasestr(p, "\r\nContent-Length:");
    if (cl && cl < hdr_end)
      clen = strtoul(cl + 17, NULL, 10);
    const char *body = hdr_end + 4;
    if (clen > (size_t)(end - body))
      clen = (size_t)(end - body);
    snprintf(a->body, sizeof a->body, "%.*s", (int)clen, body);
    p = body + clen;
  }
  return count;
}

/* One request: method, target (target_len bytes, may hold NULs), Connection: close. */
static raw_answer_t raw_request(int port, const char *method, const char *target,
                                size_t target_len) {
  char req[4096];
  int head = snprintf(req, sizeof req, "%s ", method);
  assert_true(head > 0 && (size_t)head + target_len + 128 < sizeof req);
  memcpy(req + head, target, target_len);
  size_t n = (size_t)head + target_len;
  n += (size_t)snprintf(req + n, sizeof req - n,
                        " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  raw_answer_t a = {0};
  raw_exchange(port, req, n, &a, 1);
  return a;
}

/* Asserts status and, for errors, the JSON error body with code. */
static void check_answer(const raw_answer_t *a, const char *method, const char *what, int status,
                         const char *code) {
  if (a->status != status)
    fail_msg("%s %s: status %d, want %d: %s", method, what, a->status, status, a->body);
  json_t *v = json_loads(a->body, 0, NULL);
  if (!v)
    fail_msg("%s %s: body is not JSON: %s", method, what, a->body);
  if (code) {
    json_t *err = json_object_get(v, "error");
    if (!err)
      fail_msg("%s %s: no error body: %s", method, what, a->body);
    assert_string_equal(json_string_value(json_object_get(err, "code")), code);
    assert_true(json_is_string(json_object_get(err, "message")));
  }
  json_decref(v);
}

static void expect_target(const fixture_t *f, const char *method, const char *target,
                          size_t target_len, int status, const char *code) {
  raw_answer_t a = raw_request(f->coord.port, method, target, target_len);
  char what[256];
  size_t k = 0;
  for (size_t i = 0; i < target_len && k + 5 < sizeof what; i++)
    k += (size_t)(target[i] ? snprintf(what + k, sizeof what - k, "%c", target[i])
                            : snprintf(what + k, sizeof what - k, "\\0"));
  what[k] = '\0';
  check_answer(&a, method, what, status, code);
}

#define LIT(s) (s), (sizeof(s) - 1) /* a literal with its length, embedded NULs included */

static void create_job(const fixture_t *f, const char *name) {
  char url[256], body[128];
  snprintf(url, sizeof url, "%s/v1/jobs", f->coord.base);
  snprintf(body, sizeof body, "{\"name\":\"%s\",\"workers\":2}", name);
  http_result_t r;
  harness_http("POST", url, body, strlen(body), "application/json", NULL, &r);
  if (r.status != 201)
    fail_msg("POST /v1/jobs %s: status %ld: %s", name, r.status, r.body);
  harness_http_free(&r);
}

static const char *job_state(const fixture_t *f, const char *job, char *buf, size_t len) {
  return harness_job_state(f->coord.base, job, buf, len);
}

/* The issue: the decoded path is cut at the NUL, so these used to reach job nultest (DELETE
 * stopped it) or /healthz (200). Each is now 400, and the job stays pending. */
static void test_nul_refused(void **state) {
  fixture_t *f = *state;
  char st[64];
  create_job(f, "nultest");
  assert_string_equal(job_state(f, "nultest", st, sizeof st), "pending");

  expect_target(f, "DELETE", LIT("/v1/jobs/nultest%00/../../anything"), 400, "bad_request");
  expect_target(f, "DELETE", LIT("/v1/jobs/nultest%00"), 400, "bad_request");
  expect_target(f, "PATCH", LIT("/v1/jobs/nultest%00junk"), 400, "bad_request");
  expect_target(f, "GET", LIT("/v1/jobs/nultest%00"), 400, "bad_request");
  expect_target(f, "GET", LIT("/healthz%00junk"), 400, "bad_request");
  expect_target(f, "GET", LIT("/healthz%00"), 400, "bad_request");
  expect_target(f, "GET", LIT("/healthz?x=%00"), 400, "bad_request");
  expect_target(f, "GET", LIT("/healthz?%00=1"), 400, "bad_request");
  expect_target(f, "DELETE", LIT("/v1/jobs/nultest?purge=%00true"), 400, "bad_request");
  assert_string_equal(job_state(f, "nultest", st, sizeof st), "pending");

  /* A raw NUL byte on the request line: MHD before 1.0 cuts the target there; 1.0 and later
   * close the connection unanswered. Either way no handler may see it. */
  static const struct {
    const char *method, *target;
    size_t len;
    const char *shown;
  } raw[] = {
      {"DELETE", LIT("/v1/jobs/nultest\0/../../anything"), "/v1/jobs/nultest<NUL>/../../anything"},
      {"GET", LIT("/healthz\0junk"), "/healthz<NUL>junk"},
      {"GET", LIT("/healthz?x\0=1"), "/healthz?x<NUL>=1"},
  };
  for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
    raw_answer_t a = raw_request(f->coord.port, raw[i].method, raw[i].target, raw[i].len);
    if (a.status != 0)
      check_answer(&a, raw[i].method, raw[i].shown, 400, "bad_request");
  }
  assert_string_equal(job_state(f, "nultest", st, sizeof st), "pending");

  /* The job itself is reachable, and DELETE of the exact path does stop it. */
  expect_target(f, "GET", LIT("/v1/jobs/nultest"), 200, NULL);
  expect_target(f, "GET", LIT("/v1/jobs/nul%74est"), 200, NULL); /* %74 = 't': same path */
  expect_target(f, "DELETE", LIT("/v1/jobs/nultest"), 200, NULL);
  assert_string_equal(job_state(f, "nultest", st, sizeof st), "stopped");
}

/* Only exact routes: no dot segments, no empty segments, no trailing junk; bad escapes 400. */
static void test_exact_routes(void **state) {
  fixture_t *f = *state;
  char st[64];
  create_job(f, "exact");
  static const struct {
    const char *method, *target;
    int status;
    const char *code;
  } cases[] = {
      {"DELETE", "/v1/jobs/exact/../../anything", 404, "not_found"},
      {"DELETE", "/v1/jobs/exact/..", 404, "not_found"},
      {"DELETE", "/v1/jobs/exact/.", 404, "not_found"},
      {"DELETE", "/v1/jobs/exact/", 404, "not_found"},
      {"DELETE", "/v1/jobs//exact", 404, "not_found"},
      {"DELETE", "/v1/jobs/exact/junk", 404, "not_found"},
      {"DELETE", "/v1/jobs/exact%2F..", 400, "bad_request"},
      {"DELETE", "/v1/jobs/exact%2e%2e", 404, "not_found"},
      {"GET", "/v1/jobs/exact/%2e%2e/exact", 404, "not_found"},
      {"GET", "/v1/jobs/exact/plan/", 404, "not_found"},
      {"GET", "/v1/jobs/exact%2Fplan", 400, "bad_request"},
      {"GET", "/v1/../healthz", 404, "not_found"},
      {"GET", "/healthz/..", 404, "not_found"},
      {"GET", "/healthz/", 404, "not_found"},
      {"GET", "//healthz", 404, "not_found"},
      {"GET", "/healthzjunk", 404, "not_found"},
      {"GET", "/healthz%20", 404, "not_found"},
      {"GET", "/healthz%0a", 400, "bad_request"},
      {"GET", "/healthz%0D%0AX-Injected:%201", 400, "bad_request"},
      {"GET", "/heal%zzthz", 400, "bad_request"},
      {"GET", "/healthz%", 400, "bad_request"},
      {"GET", "/healthz?x=%4", 400, "bad_request"},
      {"GET", "/healthz", 200, NULL},
      {"GET", "/heal%74hz", 200, NULL},
      {"GET", "/healthz?x=%2F", 200, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_target(f, cases[i].method, cases[i].target, strlen(cases[i].target), cases[i].status,
                  cases[i].code);
  assert_string_equal(job_state(f, "exact", st, sizeof st), "pending");
}

/* A refused request does not spoil the connection: the next request on it is answered. */
static void test_keep_alive_after_refusal(void **state) {
  fixture_t *f = *state;
  static const char two[] = "GET /healthz%00junk HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  raw_answer_t a[2];
  memset(a, 0, sizeof a);
  assert_int_equal(raw_exchange(f->coord.port, two, sizeof two - 1, a, 2), 2);
  check_answer(&a[0], "GET", "/healthz%00junk (first)", 400, "bad_request");
  check_answer(&a[1], "GET", "/healthz (second)", 200, NULL);
}

/* Refused targets are counted under route "other", not under the route of the cut path. */
static void test_metrics_label(void **state) {
  fixture_t *f = *state;
  expect_target(f, "GET", LIT("/metrics%00junk"), 400, "bad_request");
  char url[256];
  snprintf(url, sizeof url, "%s/metrics", f->coord.base);
  http_result_t r;
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  if (strstr(r.body, "route=\"/metrics\",code=\"400\""))
    fail_msg("a refused target counted under /metrics:\n%s", r.body);
  if (!strstr(r.body, "method=\"GET\",route=\"other\",code=\"400\""))
    fail_msg("no 400 under route other:\n%s", r.body);
  harness_http_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nul_refused),
      cmocka_unit_test(test_exact_routes),
      cmocka_unit_test(test_keep_alive_after_refusal),
      cmocka_unit_test(test_metrics_label),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
