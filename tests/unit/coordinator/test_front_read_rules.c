/* test_front_read_rules.c — which request heads the connection front answers itself from the read
 * cache (coordinator/front_reads.c, wg_fast_read_parse) and the head of its answers
 * (wg_fast_read_head): pure, no sockets. Whatever does not qualify goes to libmicrohttpd,
 * so each rule here keeps a request whose answer could differ away from the front. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router.h"
#include "request.h"
#include "front.h"
#include "cache.h"
#include "coord.h"

static wg_coord_t coord;

static int parse(const char *head, wg_fast_read_t *rd) {
  return wg_fast_read_parse(&coord, head, strlen(head), rd);
}

static void test_qualifies(void **state) {
  (void)state;
  wg_fast_read_t rd;
  assert_int_equal(parse("GET /v1/jobs/j1 HTTP/1.1\r\nHost: x\r\n\r\n", &rd), 1);
  assert_int_equal(rd.route.id, WG_ROUTE_JOB_GET);
  assert_string_equal(rd.route.job, "j1");
  assert_string_equal(rd.req.path, "/v1/jobs/j1");
  assert_int_equal(rd.req.nquery, 0);
  assert_int_equal(parse("GET /v1/jobs/j1/plan HTTP/1.1\r\n\r\n", &rd), 1);
  assert_int_equal(rd.route.id, WG_ROUTE_JOB_PLAN);
  assert_int_equal(
      parse("GET /v1/jobs/j1/events HTTP/1.1\r\nAccept: application/json\r\n\r\n", &rd), 1);
  assert_int_equal(rd.route.id, WG_ROUTE_JOB_EVENTS);
  /* the query, split as libmicrohttpd does: key=value, a bare key (value NULL) */
  assert_int_equal(parse("GET /v1/jobs/j1/groups?iteration=12&flag HTTP/1.1\r\n\r\n", &rd), 1);
  assert_int_equal(rd.route.id, WG_ROUTE_JOB_GROUPS);
  assert_string_equal(rd.req.path, "/v1/jobs/j1/groups");
  assert_int_equal(rd.req.nquery, 2);
  int present = 0;
  assert_string_equal(wg_request_query(&rd.req, "iteration", &present), "12");
  assert_null(wg_request_query(&rd.req, "flag", &present));
  assert_int_equal(present, 1);
  /* what browsers send */
  assert_int_equal(
      parse("GET /v1/jobs/j1 HTTP/1.1\r\nHost: x\r\nConnection:  Keep-Alive \r\n\r\n", &rd), 1);
}

static void test_goes_to_libmicrohttpd(void **state) {
  (void)state;
  wg_fast_read_t rd;
  static const char *const heads[] = {
      "HEAD /v1/jobs/j1 HTTP/1.1\r\n\r\n",                       /* not GET */
      "POST /v1/jobs/j1 HTTP/1.1\r\n\r\n",                       /* not GET */
      "GET /v1/jobs/j1 HTTP/1.0\r\n\r\n",                        /* HTTP/1.0: keep-alive differs */
      "GET /v1/jobs/j%31 HTTP/1.1\r\n\r\n",                      /* needs decoding */
      "GET /v1/jobs/j1/groups?iteration=1+2 HTTP/1.1\r\n\r\n",   /* '+' is a space to MHD */
      "GET /v1/jobs/j1 HTTP/1.1\r\nConnection: close\r\n\r\n",   /* MHD closes after */
      "GET /v1/jobs/j1 HTTP/1.1\r\nconnection: upgrade\r\n\r\n", /* anything but keep-alive */
      "GET /v1/jobs/j1/events HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n", /* a stream */
      "GET /v1/jobs HTTP/1.1\r\n\r\n",                    /* the whole cluster's list */
      "GET /v1/agents HTTP/1.1\r\n\r\n",                  /* the whole cluster's agents */
      "GET /healthz HTTP/1.1\r\n\r\n",                    /* not a cached read */
      "GET /v1/jobs/j1/nope HTTP/1.1\r\n\r\n",            /* 404: MHD's */
      "GET /v1/jobs/j1/groups?a=1&&b=2 HTTP/1.1\r\n\r\n", /* an empty query piece */
      "GET /v1/jobs/j1/groups?a=1& HTTP/1.1\r\n\r\n",     /* a trailing '&' */
      "GET /v1/jobs/j1/groups?=1 HTTP/1.1\r\n\r\n",       /* no key */
      "GET * HTTP/1.1\r\n\r\n",                           /* not a path */
  };
  for (size_t i = 0; i < sizeof heads / sizeof *heads; i++)
    if (parse(heads[i], &rd) != 0)
      fail_msg("the front would answer: %s", heads[i]);
  /* a target longer than the front's copy */
  char head[WG_FAST_TARGET_MAX + 64];
  snprintf(head, sizeof head, "GET /v1/jobs/j1/groups?iteration=%0*d HTTP/1.1\r\n\r\n",
           WG_FAST_TARGET_MAX, 1);
  assert_int_equal(parse(head, &rd), 0);
  /* with a token configured, the timeline needs it: dispatch.c checks it, not the front */
  snprintf(coord.token, sizeof coord.token, "secret");
  assert_int_equal(parse("GET /v1/jobs/j1/events HTTP/1.1\r\n\r\n", &rd), 0);
  assert_int_equal(parse("GET /v1/jobs/j1 HTTP/1.1\r\n\r\n", &rd), 1);
  coord.token[0] = '\0';
}

static void test_answer_head(void **state) {
  (void)state;
  char buf[256];
  size_t n = wg_fast_read_head(200, "application/json", 24481, buf, sizeof buf);
  assert_true(n > 0);
  assert_int_equal(strlen(buf), n);
  assert_memory_equal(buf, "HTTP/1.1 200 OK\r\nDate: ", 23);
  assert_non_null(strstr(buf, " GMT\r\nContent-Type: application/json\r\n"
                              "Content-Length: 24481\r\n\r\n"));
  assert_int_equal(wg_fast_read_head(404, "application/json", 0, buf, sizeof buf) > 0, 1);
  assert_memory_equal(buf, "HTTP/1.1 404 Not Found\r\n", 24);
  assert_int_equal(wg_fast_read_head(302, "application/json", 0, buf, sizeof buf), 0);
  assert_int_equal(wg_fast_read_head(200, "application/json", 1, buf, 40), 0);
}

int main(void) {
  static char cache_stub; /* any non-NULL cache: the parser only asks whether there is one */
  coord.cache = (wg_cache_t *)&cache_stub;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_qualifies),
                                     cmocka_unit_test(test_goes_to_libmicrohttpd),
                                     cmocka_unit_test(test_answer_head)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
