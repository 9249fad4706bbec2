/* The REST server's HTTP-level refusals and limits against a real coordinator (issue 9,
 * items 4 and 8), on raw sockets:
 *
 *   - what libmicrohttpd used to answer with its own HTML (414 URI too long, 431 headers too
 *     large, 505 version, a bad Content-Length, for which the status line and headers came
 *     twice) and the other malformed heads are answered with the documented JSON error,
 *     exactly one status line, Connection: close; earlier requests on the connection are
 *     answered first;
 *   - a head that does not complete in WG_HTTP_HEAD_TIMEOUT_S is a 408 in JSON;
 *   - more than WG_HTTP_MAX_PER_IP connections from one address: the next is refused with a
 *     JSON 503 busy and Retry-After, other addresses are still served, and the address is
 *     served again once its connections close;
 *   - requests whose client left before a worker took them are dropped (counted in
 *     wagma_http_abandoned_total), and the server keeps answering;
 *   - the refusals are counted in wagma_http_requests_total under route "other". */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "http.h"
#include "coord.h"
#include "harness.h"
#include "raw_http.h"

typedef struct fixture {
  harness_env_t *env;
  coord_proc_t coord;
} fixture_t;

static int group_setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  *state = f;
  if (!f || harness_env_start(&f->env) != 0)
    return -1;
  harness_coord_start(&f->coord, etcd_fixture_endpoints(f->env->fx), "limits", 3, NULL, NULL);
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

/* The answer is the documented JSON error with this status and code. */
static void check_error(const raw_answer_t *a, int status, const char *code, const char *what) {
  if (a->status != status)
    fail_msg("%s: status %d, want %d: %s", what, a->status, status, a->body);
  if (!strstr(a->content_type, "application/json"))
    fail_msg("%s: Content-Type '%s', want application/json: %s", what, a->content_type, a->body);
  json_t *v = json_loads(a->body, 0, NULL);
  json_t *err = json_object_get(v, "error");
  if (!err)
    fail_msg("%s: not the JSON error body: %s", what, a->body);
  assert_string_equal(json_string_value(json_object_get(err, "code")), code);
  assert_true(json_is_string(json_object_get(err, "message")));
  json_decref(v);
}

static char *repeat(char c, size_t n) {
  char *s = malloc(n + 1);
  memset(s, c, n);
  s[n] = '\0';
  return s;
}

/* Each malformed head: one answer, the JSON error, one status line in the whole stream. */
static void test_malformed_heads(void **state) {
  fixture_t *f = *state;
  char *long_target = repeat('a', WG_HTTP_MAX_LINE + 10);
  char *long_value = repeat('b', WG_HTTP_MAX_HEAD + 10);
  char *line414, *head431;
  size_t n414 = strlen(long_target) + 64, n431 = strlen(long_value) + 64;
  line414 = malloc(n414);
  head431 = malloc(n431);
  snprintf(line414, n414, "GET /%s HTTP/1.1\r\nHost: x\r\n\r\n", long_target);
  snprintf(head431, n431, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", long_value);
  char many[4096] = "GET /healthz HTTP/1.1\r\n";
  for (int i = 0; i <= WG_HTTP_MAX_FIELDS; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "X-%d: y\r\n", i);
  strcat(many, "\r\n");
  const struct {
    const char *bytes;
    int status;
    const char *code;
  } cases[] = {
      {line414, 414, "uri_too_long"},
      {head431, 431, "headers_too_large"},
      {many, 431, "headers_too_large"},
      {"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
      {"GET /healthz HTTP/0.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
      /* libmicrohttpd 0.9.75 sent these status line and headers twice */
      {"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       "Content-Length: abc\r\n\r\n{}",
       400, "bad_request"},
      {"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}", 400, "bad_request"},
      {"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400,
       "bad_request"},
      {"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", 413,
       "too_large"},
      {"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
       "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
       411, "length_required"},
      {"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n", 400, "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", 400, "bad_request"},
      {"GET /hea lthz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"},
      {"GET /healthz\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"},
      {"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 400, "bad_request"}, /* TLS hello */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    raw_answer_t a[2];
    int lines = 0;
    char what[64];
    snprintf(what, sizeof what, "case %zu", i);
    int n =
        raw_exchange(NULL, f->coord.port, cases[i].bytes, strlen(cases[i].bytes), a, 2, &lines, 10);
    if (n != 1 || lines != 1)
      fail_msg("%s: %d answers, %d status lines (want 1, 1)", what, n, lines);
    check_error(&a[0], cases[i].status, cases[i].code, what);
  }
  free(long_target);
  free(long_value);
  free(line414);
  free(head431);
}

/* A bad head after good requests on one connection: the good ones are answered first, then
 * the JSON error; a request after the bad head is not served. */
static void test_refusal_after_requests(void **state) {
  fixture_t *f = *state;
  static const char bytes[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                              "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n"
                              "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n"
                              "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  raw_answer_t a[4];
  int lines = 0;
  int n = raw_exchange(NULL, f->coord.port, bytes, sizeof bytes - 1, a, 4, &lines, 10);
  assert_int_equal(n, 3);
  assert_int_equal(lines, 3);
  assert_int_equal(a[0].status, 200);
  assert_int_equal(a[1].status, 200);
  check_error(&a[2], 400, "bad_request", "the third request");
}

/* Keep-alive and body framing still work through the front: a POST with a body, then a GET,
 * on one connection; Expect: 100-continue is honoured. */
static void test_good_requests(void **state) {
  fixture_t *f = *state;
  static const char bytes[] =
      "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 31\r\n\r\n{\"name\":\"framed\",\"workers\":1}  "
      "GET /v1/jobs/framed HTTP/1.1\r\nHost: x\r\n\r\n"
      "\r\nHEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  raw_answer_t a[4];
  int n = raw_exchange(NULL, f->coord.port, bytes, sizeof bytes - 1, a, 4, NULL, 10);
  assert_true(n >= 2);
  assert_int_equal(a[0].status, 201);
  assert_int_equal(a[1].status, 200);
  assert_non_null(strstr(a[1].body, "\"framed\""));
  static const char expect[] =
      "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nConnection: close\r\nContent-Length: 29\r\n\r\n"
      "{\"name\":\"expect\",\"workers\":1}";
  n = raw_exchange(NULL, f->coord.port, expect, sizeof expect - 1, a, 4, NULL, 10);
  assert_true(n >= 1);
  assert_int_equal(a[n - 1].status, 201);
}

/* A head that trickles in and never ends: 408 in JSON after WG_HTTP_HEAD_TIMEOUT_S. */
static void test_slow_head(void **state) {
  fixture_t *f = *state;
  int fd = raw_connect("127.0.0.7", f->coord.port, WG_HTTP_HEAD_TIMEOUT_S + 10);
  assert_true(fd >= 0);
  double t0 = raw_now();
  static const char part[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  assert_int_equal(send(fd, part, sizeof part - 1, MSG_NOSIGNAL), (ssize_t)sizeof part - 1);
  char buf[4096];
  size_t got = 0;
  for (;;) {
    ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  buf[got] = '\0';
  double waited = raw_now() - t0;
  assert_true(waited >= WG_HTTP_HEAD_TIMEOUT_S - 0.5 && waited < WG_HTTP_HEAD_TIMEOUT_S + 3);
  assert_non_null(strstr(buf, "HTTP/1.1 408 "));
  assert_non_null(strstr(buf, "\"request_timeout\""));
}

/* WG_HTTP_MAX_PER_IP connections from one address: the next is refused, others are served. */
static void test_per_address_limit(void **state) {
  fixture_t *f = *state;
  int fds[WG_HTTP_MAX_PER_IP];
  for (int i = 0; i < WG_HTTP_MAX_PER_IP; i++) {
    fds[i] = raw_connect("127.0.0.9", f->coord.port, 5);
    assert_true(fds[i] >= 0);
  }
  /* The front counts a connection once it accepted it: give it a moment. */
  int st = 0;
  for (int i = 0; i < 50 && st != 503; i++) {
    raw_answer_t a;
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    int n = raw_exchange("127.0.0.9", f->coord.port, req, sizeof req - 1, &a, 1, NULL, 5);
    st = n ? a.status : 0;
    if (st == 503) {
      check_error(&a, 503, "busy", "over the per-address limit");
      assert_string_equal(a.retry_after, "1");
    } else {
      harness_sleep(0.05);
    }
  }
  assert_int_equal(st, 503);
  double dt = raw_get_timed("127.0.0.10", f->coord.port, "/healthz", &st, 5);
  assert_int_equal(st, 200);
  assert_true(dt < 5);
  for (int i = 0; i < WG_HTTP_MAX_PER_IP; i++)
    close(fds[i]);
  st = 0;
  for (int i = 0; i < 50 && st != 200; i++) {
    raw_get_timed("127.0.0.9", f->coord.port, "/healthz", &st, 5);
    if (st != 200)
      harness_sleep(0.05);
  }
  assert_int_equal(st, 200);
}

static long metric(const fixture_t *f, const char *name) {
  char url[256];
  snprintf(url, sizeof url, "%s/metrics", f->coord.base);
  http_result_t r;
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  long v = -1;
  char pat[160];
  snprintf(pat, sizeof pat, "\n%s ", name);
  const char *p = strstr(r.body, pat);
  if (p)
    v = strtol(p + strlen(pat), NULL, 10);
  harness_http_free(&r);
  return v;
}

/* Clients that ask and leave at once: their requests are dropped, not worked on. */
static void test_abandoned(void **state) {
  fixture_t *f = *state;
  long before = metric(f, "wagma_http_abandoned_total");
  assert_true(before >= 0);
  static const char req[] = "GET /v1/jobs?limit=500 HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 200; i++) {
    int fd = raw_connect("127.0.0.11", f->coord.port, 5);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
    close(fd);
  }
  long after = before;
  for (int i = 0; i < 100 && after == before; i++) {
    harness_sleep(0.05);
    after = metric(f, "wagma_http_abandoned_total");
  }
  print_message("%ld of 200 abandoned requests dropped before any work\n", after - before);
  assert_true(after > before);
  int st;
  raw_get_timed(NULL, f->coord.port, "/healthz", &st, 5);
  assert_int_equal(st, 200);
}

/* Every refusal of the front is counted under route "other". */
static void test_refusals_counted(void **state) {
  fixture_t *f = *state;
  char url[256];
  snprintf(url, sizeof url, "%s/metrics", f->coord.base);
  http_result_t r;
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  static const char *const want[] = {
      "route=\"other\",code=\"414\"", "route=\"other\",code=\"431\"",
      "route=\"other\",code=\"505\"", "route=\"other\",code=\"411\"",
      "route=\"other\",code=\"408\"", "route=\"other\",code=\"503\"",
      "wagma_http_connections ",      "wagma_http_connections_refused_total ",
      "wagma_http_queue_depth "};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(r.body, want[i]))
      fail_msg("metrics lack %s:\n%s", want[i], r.body);
  harness_http_free(&r);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_malformed_heads),   cmocka_unit_test(test_refusal_after_requests),
      cmocka_unit_test(test_good_requests),     cmocka_unit_test(test_slow_head),
      cmocka_unit_test(test_per_address_limit), cmocka_unit_test(test_abandoned),
      cmocka_unit_test(test_refusals_counted),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
