/* Unit tests of the coordinator's pure parts: the router and the raw request target check,
 * the request checks of the dispatcher that run before any etcd call (400, 404, 405, 401, 413,
 * 415, 400, 422), the planner's plan JSON (what agents decode: members in request order, job
 * parameters, odd characters escaped) and its history entry (the groups rebuilt from it are
 * the plan's), and the metrics text. No etcd, no sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router.h"
#include "request.h"
#include "planner.h"
#include "metrics.h"
#include "handlers.h"
#include "coord.h"
#include "wagma/collective.h"

static void test_router(void **state) {
  (void)state;
  struct {
    const char *method, *path;
    int status;
    wg_route_id_t id;
    const char *job;
  } cases[] = {
      {"GET", "/v1/jobs", 0, WG_ROUTE_JOBS_LIST, ""},
      {"POST", "/v1/jobs", 0, WG_ROUTE_JOBS_SUBMIT, ""},
      {"GET", "/v1/jobs/j-1", 0, WG_ROUTE_JOB_GET, "j-1"},
      {"HEAD", "/v1/jobs/j-1", 0, WG_ROUTE_JOB_GET, "j-1"},
      {"PATCH", "/v1/jobs/j-1", 0, WG_ROUTE_JOB_PATCH, "j-1"},
      {"DELETE", "/v1/jobs/j-1", 0, WG_ROUTE_JOB_DELETE, "j-1"},
      {"GET", "/v1/jobs/j-1/groups", 0, WG_ROUTE_JOB_GROUPS, "j-1"},
      {"GET", "/v1/jobs/j-1/plan", 0, WG_ROUTE_JOB_PLAN, "j-1"},
      {"GET", "/v1/agents", 0, WG_ROUTE_AGENTS, ""},
      {"GET", "/healthz", 0, WG_ROUTE_HEALTHZ, ""},
      {"GET", "/readyz", 0, WG_ROUTE_READYZ, ""},
      {"GET", "/metrics", 0, WG_ROUTE_METRICS, ""},
      {"PUT", "/v1/jobs", 405, WG_ROUTE_NONE, ""},
      {"POST", "/v1/jobs/j-1", 405, WG_ROUTE_NONE, ""},
      {"DELETE", "/v1/jobs/j-1/plan", 405, WG_ROUTE_NONE, ""},
      {"POST", "/metrics", 405, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/a/b", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/a/plan/", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/.x", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs//plan", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/job", 404, WG_ROUTE_NONE, ""},
      {"GET", "/", 0, WG_ROUTE_UI, ""}, /* the web view (redirect to /ui/) */
      {"GET", "", 404, WG_ROUTE_NONE, ""},
      {"GET", "/healthz/", 404, WG_ROUTE_NONE, ""},
      /* Exact matches only: no dot segments, no empty segments, no trailing junk. */
      {"DELETE", "/v1/jobs/nultest/../../anything", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/nultest/../nultest", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/nultest/./plan", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/..", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/.", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/../healthz", 404, WG_ROUTE_NONE, ""},
      {"GET", "/healthz/..", 404, WG_ROUTE_NONE, ""},
      {"GET", "//healthz", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1//jobs", 404, WG_ROUTE_NONE, ""},
      {"GET", "/healthzjunk", 404, WG_ROUTE_NONE, ""},
      {"GET", "/healthz junk", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/nultest/plan/x", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobs/nultest/groupsx", 404, WG_ROUTE_NONE, ""},
      {"GET", "/v1/jobsx", 404, WG_ROUTE_NONE, ""},
      {"GET", "healthz", 404, WG_ROUTE_NONE, ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    wg_route_t r;
    wg_route(cases[i].method, cases[i].path, &r);
    if (r.status != cases[i].status || (r.status == 0 && r.id != cases[i].id))
      fail_msg("%s %s: status %d id %d", cases[i].method, cases[i].path, r.status, r.id);
    if (r.status == 0)
      assert_string_equal(r.job, cases[i].job);
    if (r.status == 405)
      assert_true(strlen(r.allow) > 0);
  }
  wg_route_t r;
  wg_route("PUT", "/v1/jobs/x", &r);
  assert_string_equal(r.allow, "GET, PATCH, DELETE, HEAD");
  wg_route("POST", "/v1/jobs", &r);
  assert_true(r.mutation);
  wg_route("GET", "/v1/jobs", &r);
  assert_false(r.mutation);
  wg_route(NULL, NULL, &r);
  assert_int_equal(r.status, 404);
}

/* The raw request target check: targets as they come on the wire, lengths given so that a
 * raw NUL byte can sit inside. */
static void test_route_target(void **state) {
  (void)state;
  struct {
    const char *target;
    size_t len; /* 0: strlen */
    int status;
  } cases[] = {
      {"/healthz", 0, 0},
      {"/v1/jobs/nultest", 0, 0},
      {"/v1/jobs/nul%74est", 0, 0}, /* encoded unreserved character: fine */
      {"/v1/jobs/x?purge=true", 0, 0},
      {"/v1/jobs/x/groups?iteration=%33", 0, 0},
      {"/v1/jobs?a=%2F&b=c+d", 0, 0}, /* an encoded '/' in the query is data */
      {"/v1/jobs/x/../../y", 0, 0},   /* raw dot segments: left to the router (404) */
      {"", 0, 0},
      {"/healthz%00junk", 0, 400},
      {"/v1/jobs/nultest%00/../../anything", 0, 400},
      {"/healthz%00", 0, 400},
      {"/healthz?x=%00", 0, 400},
      {"/healthz?%00=1", 0, 400},
      {"/healthz\0junk", 13, 400}, /* raw NUL in the path */
      {"/healthz?x\0=1", 14, 400}, /* raw NUL in the query */
      {"/healthz\0", 9, 400},      /* raw NUL at the end */
      {"/healthz%0a", 0, 400},
      {"/healthz%0D%0Ax", 0, 400},
      {"/healthz%7f", 0, 400},
      {"/healthz?x=%1b", 0, 400},
      {"/heal\tthz", 0, 400},
      {"/v1/jobs/nultest%2Fplan", 0, 400},
      {"/v1/jobs/nultest%2fplan", 0, 400},
      {"/heal%zzthz", 0, 400},
      {"/healthz%", 0, 400},
      {"/healthz%4", 0, 400},
      {"/healthz?x=%g0", 0, 400},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len = cases[i].len ? cases[i].len : strlen(cases[i].target);
    const char *why = "unset";
    int status = wg_route_target_check(cases[i].target, len, &why);
    if (status != cases[i].status)
      fail_msg("case %zu (%s): status %d, want %d", i, cases[i].target, status, cases[i].status);
    if (status == 0)
      assert_null(why);
    else
      assert_true(why != NULL && strlen(why) > 0);
  }
  /* A percent escape cut by the end of the buffer is malformed, whatever follows in memory. */
  assert_int_equal(wg_route_target_check("/a%41", 4, NULL), 400);
  assert_int_equal(wg_route_target_check("/a%41", 5, NULL), 0);
  assert_int_equal(wg_route_target_check(NULL, 0, NULL), 0);
}

static wg_coord_t *coord_without_etcd(const char *token) {
  static wg_coord_t c;
  memset(&c, 0, sizeof c);
  snprintf(c.id, sizeof c.id, "unit");
  snprintf(c.token, sizeof c.token, "%s", token);
  c.max_body = 1024;
  wagma_keys_init(&c.keys, NULL);
  return &c;
}

static void expect(wg_coord_t *c, const char *method, const char *path, const char *ct,
                   const char *auth, const char *body, int too_large, int status, const char *code,
                   const char *field) {
  wg_request_t req = {.method = method,
                      .path = path,
                      .content_type = ct,
                      .authorization = auth,
                      .body = body,
                      .body_len = body ? strlen(body) : 0,
                      .body_too_large = too_large,
                      .max_body = c->max_body};
  wg_response_t res = {0};
  wg_handle(c, &req, &res);
  if (res.status != status)
    fail_msg("%s %s: %d want %d: %s", method, path, res.status, status, res.body);
  json_t *v = json_loads(res.body, 0, NULL);
  json_t *err = json_object_get(v, "error");
  assert_non_null(err);
  assert_string_equal(json_string_value(json_object_get(err, "code")), code);
  if (field)
    assert_string_equal(json_string_value(json_object_get(err, "field")), field);
  else
    assert_null(json_object_get(err, "field"));
  if (status == 405)
    assert_true(strlen(res.allow) > 0);
  assert_int_equal(res.www_authenticate, status == 401);
  json_decref(v);
  wg_response_free(&res);
}

/* wg_handle refuses a bad raw target with 400 before routing, whatever the decoded path says
 * (MHD's decoded path of "/healthz%00junk" is "/healthz"); a good target routes as usual. */
static void expect_target(wg_coord_t *c, const char *method, const char *path, const char *target,
                          size_t target_len, int status, const char *code) {
  wg_request_t req = {.method = method,
                      .path = path,
                      .target = target,
                      .target_len = target_len ? target_len : strlen(target),
                      .max_body = c->max_body};
  wg_response_t res = {0};
  wg_handle(c, &req, &res);
  if (res.status != status)
    fail_msg("%s %s: %d want %d: %s", method, target, res.status, status, res.body);
  json_t *v = json_loads(res.body, 0, NULL);
  assert_non_null(v);
  if (code) {
    json_t *err = json_object_get(v, "error");
    assert_non_null(err);
    assert_string_equal(json_string_value(json_object_get(err, "code")), code);
    assert_null(json_object_get(err, "field"));
  }
  json_decref(v);
  wg_response_free(&res);
}

static void test_dispatch_target(void **state) {
  (void)state;
  wg_coord_t *c = coord_without_etcd("");
  expect_target(c, "GET", "/healthz", "/healthz%00junk", 0, 400, "bad_request");
  expect_target(c, "GET", "/healthz", "/healthz\0junk", 13, 400, "bad_request");
  expect_target(c, "DELETE", "/v1/jobs/nultest", "/v1/jobs/nultest%00/../../anything", 0, 400,
                "bad_request");
  expect_target(c, "GET", "/healthz", "/healthz?x=%00", 0, 400, "bad_request");
  expect_target(c, "GET", "/v1/jobs/x/plan", "/v1/jobs/x%2Fplan", 0, 400, "bad_request");
  expect_target(c, "POST", "/v1/jobs", "/v1/jobs%0a", 0, 400, "bad_request");
  /* Checked before the path: a bad target on an unknown path is 400, not 404. */
  expect_target(c, "GET", "/nope", "/nope%00", 0, 400, "bad_request");
  /* Dot segments and trailing junk reach the router, which matches exactly: 404. */
  expect_target(c, "DELETE", "/v1/jobs/nultest/../../anything", "/v1/jobs/nultest/../../anything",
                0, 404, "not_found");
  expect_target(c, "GET", "/healthzjunk", "/healthzjunk", 0, 404, "not_found");
  /* A good target routes: /healthz needs no etcd. */
  expect_target(c, "GET", "/healthz", "/healthz", 0, 200, NULL);
  expect_target(c, "GET", "/healthz", "/heal%74hz", 0, 200, NULL);
}

static void test_dispatch_checks(void **state) {
  (void)state;
  wg_coord_t *c = coord_without_etcd("tok");
  const char *js = "application/json";
  expect(c, "GET", "/nope", NULL, NULL, NULL, 0, 404, "not_found", NULL);
  expect(c, "PUT", "/v1/jobs", js, "Bearer tok", "{}", 0, 405, "method_not_allowed", NULL);
  expect(c, "POST", "/v1/jobs", js, NULL, "{}", 0, 401, "unauthorized", NULL);
  expect(c, "POST", "/v1/jobs", js, "Bearer tok2", "{}", 0, 401, "unauthorized", NULL);
  expect(c, "POST", "/v1/jobs", js, "Bearer to", "{}", 0, 401, "unauthorized", NULL);
  expect(c, "POST", "/v1/jobs", js, "Basic tok", "{}", 0, 401, "unauthorized", NULL);
  expect(c, "DELETE", "/v1/jobs/x", NULL, NULL, NULL, 0, 401, "unauthorized", NULL);
  expect(c, "POST", "/v1/jobs", js, "Bearer tok", NULL, 1, 413, "too_large", NULL);
  expect(c, "POST", "/v1/jobs", "text/json", "Bearer tok", "{}", 0, 415, "unsupported_media_type",
         NULL);
  expect(c, "PATCH", "/v1/jobs/x", NULL, "bearer tok", "{}", 0, 415, "unsupported_media_type",
         NULL);
  expect(c, "POST", "/v1/jobs", "application/json; charset=utf-8", "Bearer tok", "{\"a\":", 0, 400,
         "bad_json", NULL);
  expect(c, "POST", "/v1/jobs", js, "Bearer tok", "", 0, 400, "bad_json", NULL);
  expect(c, "POST", "/v1/jobs", js, "Bearer tok", "{\"workers\":2,\"batch_size\":0}", 0, 422,
         "invalid_spec", "batch_size");
  expect(c, "PATCH", "/v1/jobs/x", "application/merge-patch+json", "Bearer tok", "{\"seed\":3}", 0,
         422, "invalid_patch", "seed");
  /* Without a token configured, mutations pass the auth check (and fail later on content). */
  c = coord_without_etcd("");
  expect(c, "POST", "/v1/jobs", js, NULL, "{\"workers\":-1}", 0, 422, "invalid_spec", "workers");
}

static void test_planner_encoding(void **state) {
  (void)state;
  int sizes[] = {1, 2, 3, 7, 16, 50, 64, 250};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int p = sizes[k];
    char(*names)[16] = calloc((size_t)p, sizeof *names);
    wg_plan_member_t *m = calloc((size_t)p, sizeof *m);
    for (int r = 0; r < p; r++) {
      snprintf(names[r], sizeof names[r], "a%d", (r * 7919) % 100003); /* not sorted by name */
      m[r] = (wg_plan_member_t){.name = names[r],
                                .address = r == 1 ? "host\"with\\odd\tchars:1" : "127.0.0.1:7000",
                                .joiner = r % 3 == 2};
    }
    wg_plan_request_t req = {.epoch = 12,
                             .start_round = 345,
                             .group_size = 4,
                             .staleness_bound = 5,
                             .global_sync = WAGMA_SYNC_WAIT_AVOIDING,
                             .nmembers = p,
                             .members = m};
    char *json = NULL, *again = NULL, err[128];
    double secs = -1;
    assert_int_equal(wg_planner_build_json(&req, &json, &secs), 0);
    assert_true(secs >= 0);
    wagma_plan_t plan;
    if (wagma_plan_from_json(json, strlen(json), &plan, err, sizeof err) != 0)
      fail_msg("P=%d: agents cannot decode the plan: %s", p, err);
    assert_int_equal(plan.nranks, p);
    assert_int_equal(plan.epoch, 12);
    assert_int_equal(plan.start_round, 345);
    assert_int_equal(plan.group_size, 4);
    assert_int_equal(plan.staleness_bound, 5);
    assert_int_equal(plan.global_sync, WAGMA_GLOBAL_WAIT_AVOIDING);
    for (int r = 0; r < p; r++) { /* ranks are the request's order */
      assert_string_equal(plan.members[r].name, m[r].name);
      assert_string_equal(plan.members[r].address, m[r].address);
      assert_int_equal(plan.members[r].joiner, r % 3 == 2);
    }
    if (p > 1)
      assert_non_null(strstr(json, "\"host\\\"with\\\\odd\\tchars:1\""));
    assert_int_equal(wagma_plan_to_json(&plan, &again), 0);
    assert_string_equal(json, again); /* stable: re-encoding what agents read changes nothing */
    wagma_plan_free(&plan);
    free(json);
    free(again);
    free(names);
    free(m);
  }
  wg_plan_member_t one[2] = {{.name = "a", .address = "h:1"}, {.name = "b", .address = "h:2"}};
  wg_plan_request_t bad = {.group_size = 4, .staleness_bound = 1, .nmembers = 0, .members = one};
  char *json = NULL;
  assert_int_equal(wg_planner_build_json(&bad, &json, NULL), WAGMA_EINVAL);
  bad.nmembers = 2;
  bad.epoch = (uint64_t)INT64_MAX + 1; /* not representable in the JSON */
  assert_int_equal(wg_planner_build_json(&bad, &json, NULL), WAGMA_ERANGE);
  bad.epoch = 1;
  one[1].name = "a"; /* duplicate names: the plan does not validate */
  assert_int_equal(wg_planner_build_json(&bad, &json, NULL), WAGMA_EINVAL);
  assert_null(json);
}

/* The plan history entry: what GET groups rebuilds an older epoch's groups from. */
static void test_planner_record(void **state) {
  (void)state;
  const int sizes[] = {1, 3, 4, 7, 16, 100};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int p = sizes[k];
    char names[100][16], addrs[100][24];
    wg_plan_member_t m[100];
    for (int r = 0; r < p; r++) {
      snprintf(names[r], sizeof names[r], "n%03d", (r * 37) % 101);
      snprintf(addrs[r], sizeof addrs[r], "127.0.0.1:%d", 7000 + r);
      m[r] = (wg_plan_member_t){.name = names[r], .address = addrs[r], .joiner = r == p - 1};
    }
    wg_plan_request_t req = {.epoch = 9,
                             .start_round = 777,
                             .group_size = 2,
                             .staleness_bound = 3,
                             .global_sync = WAGMA_SYNC_BARRIER,
                             .nmembers = p,
                             .members = m};
    char *json = NULL, *record = NULL, err[128];
    wagma_api_error_t aerr;
    wagma_plan_t plan, rebuilt;
    wagma_plan_record_t rec;
    assert_int_equal(wg_planner_build(&req, &json, &record, NULL), 0);
    assert_int_equal(wagma_plan_from_json(json, strlen(json), &plan, err, sizeof err), 0);
    assert_int_equal(wagma_plan_record_from_json(record, strlen(record), &rec, &aerr), 0);
    assert_int_equal(rec.epoch, 9);
    assert_int_equal(rec.start_round, 777);
    assert_true(rec.phases_hash == wg_planner_phases_hash(&plan));
    assert_int_equal(wg_planner_from_record(&rec, &rebuilt), 0);
    /* the same groups in every round, the same names, epoch, start_round and tau */
    assert_int_equal(rebuilt.nranks, p);
    assert_int_equal(rebuilt.nphases, plan.nphases);
    assert_int_equal(rebuilt.epoch, 9);
    assert_int_equal(rebuilt.start_round, 777);
    assert_int_equal(rebuilt.staleness_bound, 3);
    for (uint64_t t = 777; t < 777 + 2 * (uint64_t)plan.nphases; t++)
      for (int r = 0; r < p; r++) {
        const int *a = NULL, *b = NULL;
        int ga, gb, na = wagma_plan_group(&plan, t, r, &ga, &a);
        int nb = wagma_plan_group(&rebuilt, t, r, &gb, &b);
        assert_int_equal(na, nb);
        assert_int_equal(ga, gb);
        assert_memory_equal(a, b, (size_t)na * sizeof *a);
      }
    for (int r = 0; r < p; r++)
      assert_string_equal(rebuilt.members[r].name, names[r]);
    /* an entry whose phases hash otherwise (another planner wrote it) is refused */
    wagma_plan_free(&rebuilt);
    rec.phases_hash ^= 1;
    assert_int_equal(wg_planner_from_record(&rec, &rebuilt), WAGMA_ERANGE);
    wagma_plan_record_free(&rec);
    wagma_plan_free(&plan);
    free(json);
    free(record);
  }
}

static void test_metrics(void **state) {
  (void)state;
  wg_metrics_t *m;
  assert_int_equal(wg_metrics_create(&m), 0);
  wg_metrics_http(m, "GET", "/v1/jobs/{id}", 200, 0.0007);
  wg_metrics_http(m, "GET", "/v1/jobs/{id}", 200, 0.2);
  wg_metrics_http(m, "BREW", "other", 405, 0.0001);
  wg_metrics_plan_time(m, 0.004);
  wg_metrics_regrouping(m);
  wg_metrics_set_snapshot(m, strdup("wagma_agents 3\n"));
  char *text = wg_metrics_render(m, 1);
  assert_non_null(strstr(text, "wagma_leader 1\n"));
  assert_non_null(strstr(text, "wagma_regroupings_total 1\n"));
  assert_non_null(strstr(
      text, "wagma_http_requests_total{method=\"GET\",route=\"/v1/jobs/{id}\",code=\"200\"} 2\n"));
  assert_non_null(strstr(text, "method=\"other\""));
  assert_non_null(strstr(text, "wagma_http_request_duration_seconds_bucket{le=\"0.001\"} 2\n"));
  assert_non_null(strstr(text, "wagma_http_request_duration_seconds_bucket{le=\"+Inf\"} 3\n"));
  assert_non_null(strstr(text, "wagma_plan_compute_seconds_count 1\n"));
  assert_non_null(strstr(text, "wagma_agents 3\n"));
  free(text);
  wg_metrics_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_router),           cmocka_unit_test(test_route_target),
      cmocka_unit_test(test_dispatch_target),  cmocka_unit_test(test_dispatch_checks),
      cmocka_unit_test(test_planner_encoding), cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_planner_record),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
