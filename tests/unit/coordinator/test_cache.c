/* test_cache.c — the read cache's view (coordinator/cache.c, cache_serve.c) fed by hand, without
 * etcd: what each read endpoint answers from it (the bodies the etcd handlers render from the
 * same keys, pages and continue tokens, groups of current and earlier epochs, 404s), the key
 * count its syncs compare with etcd's, and the job timeline derived from the order of the
 * changes (who left an epoch and why: registration gone, scaled down, unavailable), and the
 * timeline's bound in bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "planner.h"
#include "cache_view.h"
#include "cache.h"
#include "wagma/collective.h"

static wg_coord_t coord;
static int64_t rev;

typedef struct kvs {
  char key[128][160];
  int64_t create[128];
  int64_t version[128];
  int n;
} kvs_t;
static kvs_t known; /* create revision and version of every key put so far */

/* One change at the next revision. */
static void change(wg_cache_t *c, const char *key, const char *value) {
  wagma_etcd_event_t ev;
  memset(&ev, 0, sizeof ev);
  rev++;
  int k = 0;
  while (k < known.n && strcmp(known.key[k], key) != 0)
    k++;
  if (k == known.n) {
    snprintf(known.key[known.n++], sizeof known.key[0], "%s", key);
    known.version[k] = 0;
  }
  ev.type = value ? WAGMA_ETCD_EVENT_PUT : WAGMA_ETCD_EVENT_DELETE;
  ev.kv.key = (char *)key;
  ev.kv.key_len = strlen(key);
  ev.kv.value = (char *)(value ? value : "");
  ev.kv.value_len = value ? strlen(value) : 0;
  ev.kv.mod_revision = rev;
  if (value) {
    if (known.version[k] == 0)
      known.create[k] = rev;
    ev.kv.version = ++known.version[k];
    ev.kv.create_revision = known.create[k];
  } else {
    known.version[k] = 0;
  }
  wg_cache_feed(c, 0, &ev, 1, rev);
}

static char *plan_json(uint64_t epoch, uint64_t start, const char *const *names, int n) {
  wagma_plan_t p;
  char *json = NULL;
  assert_int_equal(wagma_plan_build(n, 2, NULL, &p), 0);
  p.epoch = epoch;
  p.start_round = start;
  p.staleness_bound = 4;
  for (int r = 0; r < n; r++) {
    snprintf(p.members[r].name, sizeof p.members[r].name, "%s", names[r]);
    snprintf(p.members[r].address, sizeof p.members[r].address, "127.0.0.1:%d",
             7000 + atoi(names[r] + 1)); /* a<k> registered at 7000 + k */
  }
  assert_int_equal(wagma_plan_to_json(&p, &json), 0);
  wagma_plan_free(&p);
  return json;
}

static char *plan_record(uint64_t epoch, uint64_t start, const char *const *names, int n) {
  wg_plan_member_t m[8];
  for (int r = 0; r < n; r++)
    m[r] = (wg_plan_member_t){.name = names[r], .address = "127.0.0.1:1"};
  wg_plan_request_t req = {.epoch = epoch,
                           .start_round = start,
                           .group_size = 2,
                           .staleness_bound = 4,
                           .nmembers = n,
                           .members = m};
  char *json = NULL, *record = NULL;
  double secs;
  assert_int_equal(wg_planner_build(&req, &json, &record, &secs), 0);
  free(json);
  return record;
}

static json_t *serve(wg_cache_t *c, const char *method, const char *path, const char *query_key,
                     const char *query_value, int want) {
  wg_request_t req = {.method = method, .path = path};
  if (query_key) {
    req.nquery = 1;
    req.query_key[0] = query_key;
    req.query_value[0] = query_value;
  }
  wg_route_t r;
  wg_route(method, path, &r);
  wg_response_t res = {0};
  assert_int_equal(wg_cache_serve(c, &req, &r, &res), 0);
  if (res.status != want)
    fail_msg("%s %s: %d, want %d: %s", method, path, res.status, want, res.body);
  json_t *v = json_loads(res.body, 0, NULL);
  wg_response_free(&res);
  return v;
}

static const char *str(json_t *v, const char *a, const char *b) {
  json_t *x = json_object_get(v, a);
  return json_string_value(b ? json_object_get(x, b) : x);
}

static const char *spec(int workers) {
  static char buf[512];
  wagma_job_spec_t s;
  wagma_api_error_t err;
  char in[128], *json = NULL;
  snprintf(in, sizeof in, "{\"name\":\"j\",\"workers\":%d,\"min_workers\":1,\"max_workers\":4}",
           workers);
  assert_int_equal(wagma_job_spec_from_json(in, strlen(in), &s, &err), 0);
  assert_int_equal(wagma_job_spec_to_json(&s, &json), 0);
  snprintf(buf, sizeof buf, "%s", json);
  free(json);
  return buf;
}

static void test_view_and_timeline(void **state) {
  (void)state;
  wg_cache_t *c = wg_cache_detached(&coord);
  assert_non_null(c);
  json_t *v = serve(c, "GET", "/v1/jobs/j", NULL, NULL, 404);
  json_decref(v);
  /* Agents, a job, its first plan. */
  change(c, "/wagma/agents/a0",
         "{\"address\":\"127.0.0.1:7000\",\"device\":\"cpu\",\"capacity\":1,"
         "\"version\":\"t\",\"started\":1}");
  change(c, "/wagma/agents/a1",
         "{\"address\":\"127.0.0.1:7001\",\"device\":\"cpu\",\"capacity\":1,"
         "\"version\":\"t\",\"started\":1}");
  change(c, "/wagma/agents/a2",
         "{\"address\":\"127.0.0.1:7002\",\"device\":\"cpu\",\"capacity\":1,"
         "\"version\":\"t\",\"started\":1}");
  change(c, "/wagma/jobs/j/spec", spec(3));
  change(c, "/wagma/jobs/j/status", "{\"state\":\"pending\",\"created\":100}");
  v = serve(c, "GET", "/v1/jobs/j", NULL, NULL, 200);
  assert_string_equal(str(v, "status", "state"), "pending");
  json_decref(v);
  v = serve(c, "GET", "/v1/jobs/j/plan", NULL, NULL, 404);
  assert_string_equal(str(v, "error", "code"), "no_plan");
  json_decref(v);
  const char *m3[] = {"a0", "a1", "a2"};
  char *p1 = plan_json(1, 0, m3, 3), *r1 = plan_record(1, 0, m3, 3);
  change(c, "/wagma/jobs/j/plan", p1);
  change(c, "/wagma/jobs/j/plans/00000000000000000001", r1);
  change(c, "/wagma/jobs/j/status",
         "{\"state\":\"running\",\"epoch\":1,\"members\":[\"a0\",\"a1\",\"a2\"],\"created\":100}");
  /* The plan is served byte for byte. */
  wg_request_t req = {.method = "GET", .path = "/v1/jobs/j/plan"};
  wg_route_t r;
  wg_response_t res = {0};
  wg_route("GET", req.path, &r);
  assert_int_equal(wg_cache_serve(c, &req, &r, &res), 0);
  assert_int_equal(res.status, 200);
  assert_string_equal(res.body, p1);
  wg_response_free(&res);
  /* Progress: members and the job's iteration. */
  change(c, "/wagma/jobs/j/progress/a0",
         "{\"state\":\"running\",\"epoch\":1,\"iteration\":41,"
         "\"loss\":0.5,\"accuracy\":0.75}");
  v = serve(c, "GET", "/v1/jobs/j", NULL, NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(v, "status"), "iteration")),
                   41);
  assert_int_equal(json_array_size(json_object_get(v, "members")), 3);
  json_decref(v);
  /* a1's registration ends; then scaled down to 1 worker: a2 leaves for that. */
  change(c, "/wagma/agents/a1", NULL);
  const char *m2[] = {"a0", "a2"};
  char *p2 = plan_json(2, 41, m2, 2), *r2 = plan_record(2, 41, m2, 2);
  change(c, "/wagma/jobs/j/plan", p2);
  change(c, "/wagma/jobs/j/plans/00000000000000000002", r2);
  change(c, "/wagma/jobs/j/spec", spec(1));
  const char *m1[] = {"a0"};
  char *p3 = plan_json(3, 50, m1, 1), *r3 = plan_record(3, 50, m1, 1);
  change(c, "/wagma/jobs/j/plan", p3);
  change(c, "/wagma/jobs/j/plans/00000000000000000003", r3);
  /* Groups: the current plan, and an earlier epoch's from the history. */
  v = serve(c, "GET", "/v1/jobs/j/groups", "iteration", "60", 200);
  assert_int_equal(json_integer_value(json_object_get(v, "epoch")), 3);
  json_decref(v);
  v = serve(c, "GET", "/v1/jobs/j/groups", "iteration", "45", 200);
  assert_int_equal(json_integer_value(json_object_get(v, "epoch")), 2);
  assert_int_equal(
      json_array_size(json_object_get(json_array_get(json_object_get(v, "groups"), 0), "members")),
      2);
  json_decref(v);
  v = serve(c, "GET", "/v1/jobs/j/groups", "iteration", "x", 400);
  json_decref(v);
  /* The timeline: submitted, running, epochs 1..3 with who left and why, scaled. */
  v = serve(c, "GET", "/v1/jobs/j/events", NULL, NULL, 200);
  json_t *ev = json_object_get(v, "events");
  /* (plan and status came at two revisions here; one Txn in the coordinator) */
  const char *types[] = {"submitted", "epoch", "state", "epoch", "scaled", "epoch"};
  assert_int_equal(json_array_size(ev), 6);
  for (size_t i = 0; i < 6; i++)
    assert_string_equal(str(json_array_get(ev, i), "type", NULL), types[i]);
  json_t *e2 = json_array_get(ev, 3), *e3 = json_array_get(ev, 5);
  json_t *left2 = json_array_get(json_object_get(e2, "left"), 0);
  assert_string_equal(str(left2, "agent", NULL), "a1");
  assert_non_null(strstr(str(left2, "reason", NULL), "registration ended"));
  json_t *left3 = json_array_get(json_object_get(e3, "left"), 0);
  assert_string_equal(str(left3, "agent", NULL), "a2");
  assert_string_equal(str(left3, "reason", NULL), "scaled down to 1 workers");
  assert_int_equal(json_array_size(json_object_get(json_array_get(ev, 1), "joined")), 3);
  json_decref(v);
  /* The key count follows puts of new keys and deletes (what a sync compares with etcd). */
  int live = 0;
  for (int k = 0; k < known.n; k++)
    live += known.version[k] > 0;
  assert_int_equal(c->count, live);
  assert_int_equal(c->applied, rev);
  /* Purged: every key of the job deleted at once. */
  const char *keys[] = {"/wagma/jobs/j/spec",
                        "/wagma/jobs/j/status",
                        "/wagma/jobs/j/plan",
                        "/wagma/jobs/j/progress/a0",
                        "/wagma/jobs/j/plans/00000000000000000001",
                        "/wagma/jobs/j/plans/00000000000000000002",
                        "/wagma/jobs/j/plans/00000000000000000003"};
  wagma_etcd_event_t del[7];
  memset(del, 0, sizeof del);
  rev++;
  for (int i = 0; i < 7; i++) {
    del[i].type = WAGMA_ETCD_EVENT_DELETE;
    del[i].kv.key = (char *)keys[i];
    del[i].kv.key_len = strlen(keys[i]);
    del[i].kv.mod_revision = rev;
  }
  wg_cache_feed(c, 0, del, 7, rev);
  v = serve(c, "GET", "/v1/jobs/j", NULL, NULL, 404);
  json_decref(v);
  assert_int_equal(c->count, live - 7);
  free(p1);
  free(p2);
  free(p3);
  free(r1);
  free(r2);
  free(r3);
  wg_cache_stop(c);
}

static void test_pages(void **state) {
  (void)state;
  wg_cache_t *c = wg_cache_detached(&coord);
  const char *ids[] = {"b", "a", "a-b", "a0", "c"}; /* key order: a-b, a, a0, b, c */
  for (int i = 0; i < 5; i++) {
    char key[64], sp[160];
    snprintf(key, sizeof key, "/wagma/jobs/%s/spec", ids[i]);
    snprintf(sp, sizeof sp, "{\"name\":\"%s\",\"workers\":1}", ids[i]);
    wagma_job_spec_t s;
    wagma_api_error_t err;
    char *json = NULL;
    assert_int_equal(wagma_job_spec_from_json(sp, strlen(sp), &s, &err), 0);
    assert_int_equal(wagma_job_spec_to_json(&s, &json), 0);
    change(c, key, json);
    free(json);
    snprintf(key, sizeof key, "/wagma/jobs/%s/status", ids[i]);
    change(c, key, i == 4 ? "{\"state\":\"running\"}" : "{\"state\":\"pending\"}");
  }
  const char *want[] = {"a-b", "a", "a0", "b", "c"};
  char token[256] = "";
  int seen = 0;
  for (int page = 0; page < 5; page++) {
    json_t *v =
        serve(c, "GET", "/v1/jobs", token[0] ? "continue" : "limit", token[0] ? token : "2", 200);
    json_t *jobs = json_object_get(v, "jobs");
    for (size_t i = 0; i < json_array_size(jobs); i++)
      assert_string_equal(str(json_array_get(jobs, i), "id", NULL), want[seen++]);
    const char *t = str(v, "continue", NULL);
    snprintf(token, sizeof token, "%s", t ? t : "");
    json_decref(v);
    if (!token[0])
      break;
  }
  assert_int_equal(seen, 5); /* every job once, in key order (limit 2 then the default) */
  json_t *v = serve(c, "GET", "/v1/jobs", "state", "running", 200);
  assert_int_equal(json_array_size(json_object_get(v, "jobs")), 1);
  json_decref(v);
  json_decref(serve(c, "GET", "/v1/jobs", "continue", "nope", 400));
  json_decref(serve(c, "GET", "/v1/jobs", "limit", "0", 400));
  wg_cache_stop(c);
}

/* A job whose plans replace 200 members at each epoch: its timeline keeps the newest entries
 * within WG_CACHE_TIMELINE_BYTES (each epoch entry names 400 members, ~30 KiB; 80 epochs would
 * be ~2.4 MiB), the latest epoch last. */
static void test_timeline_bounded(void **state) {
  (void)state;
  enum { N = 200, EPOCHS = 80 };
  wg_cache_t *c = wg_cache_detached(&coord);
  assert_non_null(c);
  static char names[2 * N][64];
  const char *set[2][N];
  for (int k = 0; k < 2 * N; k++) {
    snprintf(names[k], sizeof names[k], "a%d-%.56s", k,
             "member-with-a-long-name-of-sixty-three-characters-xxxxxxxxxxxxx");
    set[k / N][k % N] = names[k];
  }
  change(c, "/wagma/jobs/big/spec", spec(4));
  change(c, "/wagma/jobs/big/status", "{\"state\":\"running\",\"created\":100}");
  for (int e = 1; e <= EPOCHS; e++) {
    char *p = plan_json((uint64_t)e, (uint64_t)e * 10, set[e % 2], N);
    change(c, "/wagma/jobs/big/plan", p);
    free(p);
  }
  wg_request_t req = {.method = "GET", .path = "/v1/jobs/big/events"};
  wg_route_t r;
  wg_response_t res = {0};
  wg_route("GET", req.path, &r);
  assert_int_equal(wg_cache_serve(c, &req, &r, &res), 0);
  assert_int_equal(res.status, 200);
  print_message("timeline of %d epochs: %zu bytes\n", EPOCHS, res.body_len);
  assert_true(res.body_len <= WG_CACHE_TIMELINE_BYTES + 4096);
  json_t *v = json_loads(res.body, 0, NULL);
  json_t *ev = json_object_get(v, "events");
  assert_true(json_array_size(ev) > 10 && json_array_size(ev) < EPOCHS);
  json_t *last = json_array_get(ev, json_array_size(ev) - 1);
  assert_int_equal(json_integer_value(json_object_get(last, "epoch")), EPOCHS);
  json_decref(v);
  wg_response_free(&res);
  wg_cache_stop(c);
}

int main(void) {
  wagma_keys_init(&coord.keys, "/wagma");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_view_and_timeline),
                                     cmocka_unit_test(test_pages),
                                     cmocka_unit_test(test_timeline_bounded)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
