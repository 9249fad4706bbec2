/* GET /v1/jobs in pages (issue 9, item 4) against a real coordinator and etcd: ?limit (default
 * 100, at most 500) and the opaque ?continue token. Every job exactly once, in key order, over
 * the pages; a page full unless it is the last; no token on the last page; jobs created and
 * removed between pages do not make an existing job disappear or come twice; the state
 * filter pages too; bad limits and tokens are 400 naming the parameter; wagmactl list
 * follows the tokens. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pages.h"
#include "coord.h"
#include "harness.h"

#ifndef WAGMACTL_BIN
#error "WAGMACTL_BIN must be defined"
#endif

typedef struct fixture {
  harness_env_t *env;
  coord_proc_t coord;
  char ids[400][WAGMA_API_NAME_MAX]; /* the jobs created by setup, in key order */
  int nids;
} fixture_t;

static int cmp_key(const void *a, const void *b) {
  return wg_job_key_cmp(a, b);
}

static void post_job(const fixture_t *f, const char *name) {
  char url[256], body[160];
  snprintf(url, sizeof url, "%s/v1/jobs", f->coord.base);
  int n = snprintf(body, sizeof body, "{\"name\":\"%s\",\"workers\":2}", name);
  http_result_t r;
  harness_http("POST", url, body, (size_t)n, "application/json", NULL, &r);
  if (r.status != 201)
    fail_msg("POST %s: %ld %s", name, r.status, r.body);
  harness_http_free(&r);
}

static void stop_job(const fixture_t *f, const char *name, int purge) {
  char url[256];
  http_result_t r;
  snprintf(url, sizeof url, "%s/v1/jobs/%s", f->coord.base, name);
  harness_http("DELETE", url, NULL, 0, NULL, NULL, &r);
  harness_http_free(&r);
  if (purge) {
    snprintf(url, sizeof url, "%s/v1/jobs/%s?purge=true", f->coord.base, name);
    harness_http("DELETE", url, NULL, 0, NULL, NULL, &r);
    assert_int_equal(r.status, 204);
    harness_http_free(&r);
  }
}

/* Names that sort around '/' ("a-b/" < "a.b/" < "a/" < "a0/"), and 290 ordinary ones. */
static const char *const odd_names[] = {"a", "a-b", "a.b", "a0", "ab", "a_", "_x",
                                        "0", "0-",  "0.0", "A",  "Z",  "a-", "a--"};

static int group_setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  *state = f;
  if (!f || harness_env_start(&f->env) != 0)
    return -1;
  harness_coord_start(&f->coord, etcd_fixture_endpoints(f->env->fx), "pages", 3, NULL, NULL);
  for (size_t i = 0; i < sizeof odd_names / sizeof odd_names[0]; i++)
    snprintf(f->ids[f->nids++], WAGMA_API_NAME_MAX, "%s", odd_names[i]);
  for (int i = 0; f->nids < 300; i++)
    snprintf(f->ids[f->nids++], WAGMA_API_NAME_MAX, "job-%03d%s", i, i % 7 == 0 ? "-x" : "");
  for (int i = 0; i < f->nids; i++)
    post_job(f, f->ids[i]);
  qsort(f->ids, (size_t)f->nids, WAGMA_API_NAME_MAX, cmp_key);
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

/* One page: the ids into out (appended at *n), the token into tok ("" = none). */
static void get_page(const fixture_t *f, const char *query, char (*out)[WAGMA_API_NAME_MAX], int *n,
                     int max, char *tok, size_t toklen, int *page_len) {
  char url[512];
  long st = 0;
  snprintf(url, sizeof url, "%s/v1/jobs%s", f->coord.base, query);
  json_t *v = harness_get_json(url, &st);
  if (st != 200 || !v)
    fail_msg("GET %s: %ld", url, st);
  json_t *jobs = json_object_get(v, "jobs");
  size_t i;
  json_t *j;
  *page_len = (int)json_array_size(jobs);
  json_array_foreach(jobs, i, j) {
    assert_true(*n < max);
    snprintf(out[(*n)++], WAGMA_API_NAME_MAX, "%s", json_string_value(json_object_get(j, "id")));
  }
  const char *t = json_string_value(json_object_get(v, "continue"));
  snprintf(tok, toklen, "%s", t ? t : "");
  json_decref(v);
}

/* Follows the tokens from the first page; returns the number of pages. */
static int list_all(const fixture_t *f, const char *filter, int limit,
                    char (*out)[WAGMA_API_NAME_MAX], int *n, int max, int expect_full) {
  char q[256], tok[WG_LIST_TOKEN_MAX] = "";
  int pages = 0, len = 0;
  *n = 0;
  for (;;) {
    int lim = limit;
    if (lim)
      snprintf(q, sizeof q, "?limit=%d%s%s%s%s", lim, filter[0] ? "&" : "", filter,
               tok[0] ? "&continue=" : "", tok);
    else
      snprintf(q, sizeof q, "%s%s%s%s%s", filter[0] || tok[0] ? "?" : "", filter,
               filter[0] && tok[0] ? "&" : "", tok[0] ? "continue=" : "", tok);
    get_page(f, q, out, n, max, tok, sizeof tok, &len);
    pages++;
    assert_true(len <= (limit ? limit : WG_LIST_LIMIT_DEFAULT));
    if (!tok[0])
      break;
    if (expect_full && len != (limit ? limit : WG_LIST_LIMIT_DEFAULT))
      fail_msg("page %d holds %d jobs but a token follows", pages, len);
    assert_true(pages < 1000);
  }
  return pages;
}

static void test_pages_cover_all(void **state) {
  fixture_t *f = *state;
  static char got[1000][WAGMA_API_NAME_MAX];
  int n = 0;
  for (int limit = 1; limit <= 301; limit += limit < 10 ? 3 : 97) {
    int pages = list_all(f, "", limit, got, &n, 1000, 1);
    if (n != f->nids)
      fail_msg("limit %d: %d jobs over %d pages, %d exist", limit, n, pages, f->nids);
    for (int i = 0; i < n; i++)
      if (strcmp(got[i], f->ids[i]) != 0)
        fail_msg("limit %d: job %d is %s, want %s (key order)", limit, i, got[i], f->ids[i]);
    assert_int_equal(pages, (f->nids + limit - 1) / limit);
  }
  /* The default is 100; 500 holds them all, without a token. */
  assert_int_equal(list_all(f, "", 0, got, &n, 1000, 1), 3);
  assert_int_equal(n, f->nids);
  char tok[WG_LIST_TOKEN_MAX];
  int len = 0;
  n = 0;
  get_page(f, "?limit=500", got, &n, 1000, tok, sizeof tok, &len);
  assert_int_equal(len, f->nids);
  assert_string_equal(tok, "");
}

static void test_bad_parameters(void **state) {
  fixture_t *f = *state;
  static const struct {
    const char *query, *field;
  } bad[] = {
      {"?limit=0", "limit"},         {"?limit=501", "limit"},
      {"?limit=-1", "limit"},        {"?limit=abc", "limit"},
      {"?limit=", "limit"},          {"?limit=1e2", "limit"},
      {"?continue=abc", "continue"}, {"?continue=MTo5OTpqb2I", "continue"},
      {"?state=done", "state"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char url[256];
    long st = 0;
    snprintf(url, sizeof url, "%s/v1/jobs%s", f->coord.base, bad[i].query);
    json_t *v = harness_get_json(url, &st);
    json_t *err = json_object_get(v, "error");
    if (st != 400 || !err)
      fail_msg("%s: %ld", bad[i].query, st);
    assert_string_equal(json_string_value(json_object_get(err, "code")), "bad_request");
    assert_string_equal(json_string_value(json_object_get(err, "field")), bad[i].field);
    json_decref(v);
  }
}

/* Jobs created before and after the position, and removed, between pages: each job that
 * exists throughout comes exactly once, nothing comes twice, the order holds. */
static void test_pages_under_churn(void **state) {
  fixture_t *f = *state;
  static char got[1000][WAGMA_API_NAME_MAX];
  char tok[WG_LIST_TOKEN_MAX] = "", q[256], name[64];
  int n = 0, len = 0, pages = 0, made = 0;
  uint32_t r = 12345;
  for (;;) {
    snprintf(q, sizeof q, "?limit=9%s%s", tok[0] ? "&continue=" : "", tok);
    get_page(f, q, got, &n, 1000, tok, sizeof tok, &len);
    pages++;
    if (!tok[0])
      break;
    /* New jobs all over the key space: next to existing names and at both ends. */
    for (int k = 0; k < 4; k++) {
      r = r * 1103515245u + 12345u;
      const char *near = f->ids[(r >> 8) % (uint32_t)f->nids];
      static const char *const tails[] = {"-n", ".n", "0n", "n", "_n"};
      snprintf(name, sizeof name, "%s%s%d", near, tails[(r >> 4) % 5], made++);
      post_job(f, name);
      if (k == 0 && made > 4) { /* and remove one made earlier */
        char old[64];
        snprintf(old, sizeof old, "%s", name);
        stop_job(f, old, 1);
      }
    }
  }
  for (int i = 1; i < n; i++)
    if (wg_job_key_cmp(got[i - 1], got[i]) >= 0)
      fail_msg("%s listed before %s", got[i - 1], got[i]);
  for (int j = 0; j < f->nids; j++) {
    int seen = 0;
    for (int i = 0; i < n; i++)
      seen += strcmp(got[i], f->ids[j]) == 0;
    if (seen != 1)
      fail_msg("%s listed %d times over %d pages", f->ids[j], seen, pages);
  }
  print_message("%d pages, %d jobs listed, %d created meanwhile\n", pages, n, made);
}

static void test_filter_pages(void **state) {
  fixture_t *f = *state;
  static char got[1000][WAGMA_API_NAME_MAX];
  int n = 0;
  /* Stop every fifth job of the original set. */
  int nstopped = 0;
  for (int i = 0; i < f->nids; i += 5, nstopped++)
    stop_job(f, f->ids[i], 0);
  list_all(f, "state=stopped", 7, got, &n, 1000, 0);
  assert_int_equal(n, nstopped);
  for (int i = 0; i < n; i++)
    assert_string_equal(got[i], f->ids[5 * i]);
  list_all(f, "state=running", 7, got, &n, 1000, 0);
  assert_int_equal(n, 0);
}

/* wagmactl list follows the tokens: every job in one table (and in --json, one array). */
static void test_wagmactl_list(void **state) {
  fixture_t *f = *state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s --server %s --json list", WAGMACTL_BIN, f->coord.base);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 22, len = 0;
  char *buf = malloc(cap);
  size_t m;
  while ((m = fread(buf + len, 1, cap - 1 - len, p)) > 0)
    len += m;
  buf[len] = '\0';
  assert_int_equal(pclose(p), 0);
  json_t *v = json_loads(buf, 0, NULL);
  assert_non_null(v);
  json_t *jobs = json_object_get(v, "jobs");
  /* More than one default page (every job of the fixture, plus those of the churn test). */
  assert_true(json_array_size(jobs) >= (size_t)f->nids);
  assert_null(json_object_get(v, "continue"));
  for (size_t i = 1; i < json_array_size(jobs); i++)
    assert_true(
        wg_job_key_cmp(json_string_value(json_object_get(json_array_get(jobs, i - 1), "id")),
                       json_string_value(json_object_get(json_array_get(jobs, i), "id"))) < 0);
  json_decref(v);
  /* The table: one line per job plus the header. */
  snprintf(cmd, sizeof cmd, "%s --server %s list | wc -l", WAGMACTL_BIN, f->coord.base);
  p = popen(cmd, "r");
  long lines = 0;
  assert_int_equal(fscanf(p, "%ld", &lines), 1);
  pclose(p);
  assert_true(lines >= f->nids + 1);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pages_cover_all),   cmocka_unit_test(test_bad_parameters),
      cmocka_unit_test(test_pages_under_churn), cmocka_unit_test(test_filter_pages),
      cmocka_unit_test(test_wagmactl_list),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
