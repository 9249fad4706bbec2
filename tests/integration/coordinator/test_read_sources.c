/* The read endpoints give the same answers from both read sources (coordinator/reads.h): a
 * coordinator with the read cache (the view, cache_serve.c) and one with --read-cache off
 * (etcd, reads_etcd.c), against one real etcd, through libcurl:
 *
 *   - the same status and the same body bytes for every read: the job list with and without
 *     filters and limits, every page of it by its continue tokens (a token of one source
 *     read by the other), a running, a pending and a stopped job, a plan, no plan yet, the
 *     groups now, of a round of the current plan and of a round only the plan history has,
 *     the agents, unknown jobs and bad parameters;
 *   - a timeline is the cache's: the etcd source answers 503, the cache 200.
 *
 * The jobs: "rs-a" runs on two agents until one dies (so it has a plan history), "rs-b" runs
 * on two others, "rs-c" waits for agents, "rs-d" is stopped. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define NAGENTS 4

typedef struct fixture {
  harness_env_t *env;
  coord_proc_t cached, direct; /* direct: --read-cache off */
  fake_agent_t agents[NAGENTS];
} fixture_t;

static int submit(const char *base, const char *spec) {
  char url[160];
  http_result_t r;
  snprintf(url, sizeof url, "%s/v1/jobs", base);
  harness_http("POST", url, spec, strlen(spec), "application/json", NULL, &r);
  int ok = r.status == 201;
  harness_http_free(&r);
  return ok ? 0 : -1;
}

static int group_setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  *state = f;
  if (!f || harness_env_start(&f->env) != 0)
    return -1;
  const char *eps = etcd_fixture_endpoints(f->env->fx);
  harness_coord_start(&f->cached, eps, "rs-cached", 3, NULL, NULL);
  harness_sleep(0.5); /* the first one leads */
  static const char *const off[] = {"--read-cache", "off", NULL};
  harness_coord_start(&f->direct, eps, "rs-direct", 3, NULL, off);
  for (int i = 0; i < NAGENTS; i++) {
    char name[32];
    snprintf(name, sizeof name, "rs-agent-%d", i);
    harness_agent_start(f->env->etcd, &f->agents[i], name, 7200 + i, 5);
  }
  const char *b = f->cached.base;
  if (submit(b, "{\"name\":\"rs-a\",\"workers\":2,\"min_workers\":1,\"iterations\":100000}") ||
      harness_wait_epoch(b, "rs-a", 1, 20) < 0)
    return -1;
  if (submit(b, "{\"name\":\"rs-b\",\"workers\":2,\"min_workers\":2,\"iterations\":100000}") ||
      harness_wait_epoch(b, "rs-b", 1, 20) < 0)
    return -1;
  if (submit(b, "{\"name\":\"rs-c\",\"workers\":2,\"min_workers\":2,\"iterations\":50}") ||
      submit(b, "{\"name\":\"rs-d\",\"workers\":2,\"min_workers\":2,\"iterations\":50}"))
    return -1;
  char url[160];
  http_result_t r;
  snprintf(url, sizeof url, "%s/v1/jobs/rs-d", b);
  harness_http("DELETE", url, NULL, 0, NULL, NULL, &r);
  int ok = r.status == 200;
  harness_http_free(&r);
  if (!ok)
    return -1;
  /* rs-a's members report, then one dies: epoch 2 starts at round 12, epoch 1 is history. */
  json_t *plan = NULL;
  long st = 0;
  snprintf(url, sizeof url, "%s/v1/jobs/rs-a/plan", b);
  plan = harness_get_json(url, &st);
  json_t *members = plan ? json_object_get(plan, "members") : NULL;
  if (st != 200 || json_array_size(members) != 2) {
    json_decref(plan);
    return -1;
  }
  const char *gone = json_string_value(json_object_get(json_array_get(members, 1), "name"));
  for (size_t m = 0; m < 2; m++) {
    const char *name = json_string_value(json_object_get(json_array_get(members, m), "name"));
    harness_progress(f->env->etcd, "rs-a", name, 10 + m * 2, "running", 1.5);
  }
  for (int i = 0; i < NAGENTS; i++)
    if (strcmp(f->agents[i].name, gone) == 0)
      harness_agent_kill(f->env->etcd, &f->agents[i]);
  json_decref(plan);
  if (harness_wait_epoch(b, "rs-a", 2, 20) < 0)
    return -1;
  harness_sleep(0.5); /* the scheduler's passes after the new plan */
  return 0;
}

static int group_teardown(void **state) {
  fixture_t *f = *state;
  if (f) {
    if (f->direct.pid > 0)
      harness_coord_stop(&f->direct, SIGTERM);
    if (f->cached.pid > 0)
      harness_coord_stop(&f->cached, SIGTERM);
    for (int i = 0; i < NAGENTS; i++)
      if (f->agents[i].ka)
        harness_agent_kill(f->env->etcd, &f->agents[i]);
    harness_env_stop(f->env);
    free(f);
  }
  return 0;
}

static void get(const coord_proc_t *c, const char *path, http_result_t *r) {
  char url[512];
  snprintf(url, sizeof url, "%s%s", c->base, path);
  harness_http("GET", url, NULL, 0, NULL, NULL, r);
}

/* GET path from both; asserts the same status and body (a few tries: the scheduler may write
 * between the two reads). Returns the cached answer's body. Ownership: the caller frees. */
static char *same(fixture_t *f, const char *path, long want_status) {
  http_result_t a = {0}, d = {0};
  int equal = 0;
  for (int attempt = 0; attempt < 5 && !equal; attempt++) {
    if (attempt) {
      harness_http_free(&a);
      harness_http_free(&d);
      harness_sleep(0.3);
    }
    get(&f->cached, path, &a);
    get(&f->direct, path, &d);
    equal = a.status == d.status && a.len == d.len && memcmp(a.body, d.body, a.len) == 0;
  }
  if (!equal || a.status != want_status)
    fprintf(stderr, "GET %s\n  cache %ld: %s\n  etcd  %ld: %s\n", path, a.status, a.body, d.status,
            d.body);
  assert_true(equal);
  assert_int_equal(a.status, want_status);
  char *body = strdup(a.body);
  harness_http_free(&a);
  harness_http_free(&d);
  return body;
}

static void test_same_answers(void **state) {
  fixture_t *f = *state;
  static const struct {
    const char *path;
    long status;
  } reads[] = {
      {"/v1/jobs", 200},
      {"/v1/jobs?state=running", 200},
      {"/v1/jobs?state=pending", 200},
      {"/v1/jobs?state=stopped", 200},
      {"/v1/jobs?state=failed&limit=1", 200},
      {"/v1/jobs?state=bogus", 400},
      {"/v1/jobs?limit=0", 400},
      {"/v1/jobs?continue=garbage", 400},
      {"/v1/jobs/rs-a", 200},
      {"/v1/jobs/rs-c", 200},
      {"/v1/jobs/rs-d", 200},
      {"/v1/jobs/nope", 404},
      {"/v1/jobs/rs-a/plan", 200},
      {"/v1/jobs/rs-c/plan", 404},
      {"/v1/jobs/nope/plan", 404},
      {"/v1/jobs/rs-a/groups", 200},
      {"/v1/jobs/rs-a/groups?iteration=3", 200},  /* epoch 1: the plan history */
      {"/v1/jobs/rs-a/groups?iteration=40", 200}, /* the current plan */
      {"/v1/jobs/rs-b/groups?iteration=7", 200},
      {"/v1/jobs/rs-a/groups?iteration=x", 400},
      {"/v1/jobs/rs-c/groups", 404},
      {"/v1/agents", 200},
  };
  for (size_t i = 0; i < sizeof reads / sizeof *reads; i++)
    free(same(f, reads[i].path, reads[i].status));

  /* The history answer is epoch 1's, the current one epoch 2's. */
  char *old = same(f, "/v1/jobs/rs-a/groups?iteration=3", 200);
  assert_non_null(strstr(old, "\"epoch\":1,"));
  free(old);
  char *now = same(f, "/v1/jobs/rs-a/groups", 200);
  assert_non_null(strstr(now, "\"epoch\":2,"));
  free(now);
}

/* Every page of the list, one job a page, each page's token read by both sources. */
static void test_same_pages(void **state) {
  fixture_t *f = *state;
  static const char *const firsts[] = {"/v1/jobs?limit=1", "/v1/jobs?limit=3",
                                       "/v1/jobs?state=running&limit=1"};
  for (size_t k = 0; k < sizeof firsts / sizeof *firsts; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s", firsts[k]);
    int pages = 0;
    for (;;) {
      char *body = same(f, path, 200);
      json_t *o = json_loads(body, 0, NULL);
      free(body);
      assert_non_null(o);
      pages++;
      const char *tok = json_string_value(json_object_get(o, "continue"));
      if (!tok) {
        json_decref(o);
        break;
      }
      const char *q = strchr(firsts[k], '?');
      snprintf(path, sizeof path, "/v1/jobs%s&continue=%s", q, tok);
      json_decref(o);
      assert_true(pages < 10);
    }
    /* four jobs: one a page, three a page; two running ones at least two pages (a filtered
     * page may end before the sources know that no running job is left) */
    if (k < 2)
      assert_int_equal(pages, k == 0 ? 4 : 2);
    else
      assert_true(pages >= 2);
  }
}

static void test_timeline_is_the_caches(void **state) {
  fixture_t *f = *state;
  http_result_t a, d;
  get(&f->cached, "/v1/jobs/rs-a/events", &a);
  get(&f->direct, "/v1/jobs/rs-a/events", &d);
  assert_int_equal(a.status, 200);
  assert_non_null(strstr(a.body, "\"events\":["));
  assert_int_equal(d.status, 503);
  assert_non_null(strstr(d.body, "read cache"));
  harness_http_free(&a);
  harness_http_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_answers),
      cmocka_unit_test(test_same_pages),
      cmocka_unit_test(test_timeline_is_the_caches),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
