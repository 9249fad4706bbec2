/* Integration test of the plan history behind GET /v1/jobs/{id}/groups?iteration=T: a real
 * etcd (tests/support fixture), a real coordinator process, agents faked as leased keys.
 *
 * A job goes through epochs of different sizes and start_rounds (4 members from round 0, 3
 * from 40, 4 from 75, then a restart from a checkpoint of iteration 60 with 2 new members),
 * and for rounds T of every epoch the endpoint must answer that epoch's groups: the plan of
 * the highest epoch whose start_round <= T, phase T mod L of it, global when (T+1) mod tau ==
 * 0, compared with wagma_plan_group on the plan the test builds itself. Also: start_round
 * ignores a stale report of an older epoch, the job's iteration never goes back (not even
 * across the restart from the older checkpoint), a T before every kept plan is a 404, the
 * history keeps the last WAGMA_API_PLAN_HISTORY epochs, and a purge removes it. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "etcd_fixture.h"
#include "harness.h"
#include "wagma/api.h"
#include "wagma/collective.h"
#include "wagma/etcd.h"

#define GROUP_SIZE 2
#define TAU 4

typedef harness_env_t env_t;

/* GET base+path, checks the status, returns the JSON body. */
static json_t *get(const coord_proc_t *c, const char *path, long want) {
  char u[256];
  long st = 0;
  snprintf(u, sizeof u, "%s%s", c->base, path);
  json_t *v = harness_get_json(u, &st);
  if (st != want)
    fail_msg("GET %s: status %ld, want %ld", path, st, want);
  return v;
}

static json_t *job_status(const coord_proc_t *c, const char *job) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  json_t *v = get(c, path, 200);
  json_t *st = json_incref(json_object_get(v, "status"));
  json_decref(v);
  return st;
}

static uint64_t int_of(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v))
    fail_msg("no integer %s", key);
  return (uint64_t)json_integer_value(v);
}

/* The plan the coordinator's planner makes for these members (rank order). */
static void expected_plan(wagma_plan_t *plan, uint64_t epoch, uint64_t start_round,
                          const char *const *names, int n) {
  assert_int_equal(wagma_plan_build(n, GROUP_SIZE, NULL, plan), 0);
  plan->epoch = epoch;
  plan->start_round = start_round;
  plan->staleness_bound = TAU;
  for (int r = 0; r < n; r++)
    snprintf(plan->members[r].name, sizeof plan->members[r].name, "%s", names[r]);
}

/* GET groups?iteration=t must describe round t of plan exactly. */
static void expect_groups(const coord_proc_t *c, const char *job, uint64_t t,
                          const wagma_plan_t *plan) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/groups?iteration=%llu", job, (unsigned long long)t);
  json_t *v = get(c, path, 200);
  if (int_of(v, "epoch") != plan->epoch)
    fail_msg("iteration %llu: epoch %llu, want %llu", (unsigned long long)t,
             (unsigned long long)int_of(v, "epoch"), (unsigned long long)plan->epoch);
  assert_int_equal(int_of(v, "start_round"), plan->start_round);
  assert_int_equal(int_of(v, "iteration"), t);
  assert_int_equal(int_of(v, "phase"), t % (uint64_t)plan->nphases);
  int global = (t + 1) % TAU == 0;
  assert_string_equal(json_string_value(json_object_get(v, "kind")), global ? "global" : "group");
  json_t *groups = json_object_get(v, "groups");
  if (global) {
    assert_int_equal(json_array_size(groups), 1);
    json_t *ranks = json_object_get(json_array_get(groups, 0), "ranks");
    assert_int_equal(json_array_size(ranks), plan->nranks);
  } else {
    assert_int_equal(json_array_size(groups), wagma_plan_phase(plan, t)->ngroups);
  }
  /* Every rank's group, as the engine computes it for round t. */
  for (int r = 0; r < plan->nranks; r++) {
    int g = 0, n = plan->nranks;
    const int *ranks = NULL;
    if (!global) {
      n = wagma_plan_group(plan, t, r, &g, &ranks);
      assert_true(n > 0);
    }
    json_t *grp = json_array_get(groups, (size_t)g);
    json_t *jr = json_object_get(grp, "ranks"), *jm = json_object_get(grp, "members");
    assert_int_equal(int_of(grp, "group"), g);
    assert_int_equal(json_array_size(jr), n);
    assert_int_equal(json_array_size(jm), n);
    for (int k = 0; k < n; k++) {
      int want = global ? k : ranks[k];
      assert_int_equal(json_integer_value(json_array_get(jr, (size_t)k)), want);
      assert_string_equal(json_string_value(json_array_get(jm, (size_t)k)),
                          plan->members[want].name);
    }
  }
  json_decref(v);
}

/* Keys under <prefix>/jobs/<job>/plans/: their count and the oldest epoch kept. */
static size_t history_keys(env_t *e, const char *job, uint64_t *oldest) {
  char prefix[128];
  wagma_etcd_range_t r = {0};
  wagma_etcd_range_options_t o = {.prefix = 1};
  snprintf(prefix, sizeof prefix, "/wagma/jobs/%s/plans/", job);
  assert_int_equal(wagma_etcd_range(e->etcd, prefix, &o, &r), 0);
  size_t n = r.n;
  if (oldest)
    *oldest = n ? strtoull(r.kvs[0].key + strlen(prefix), NULL, 10) : 0;
  wagma_etcd_range_free(&r);
  return n;
}

/* Deletes the agent keys of the named agents in one Txn (they leave in the same scheduler
 * pass), then stops their leases. */
static void kill_together(env_t *e, fake_agent_t *const *agents, int n) {
  char keys[8][96];
  wagma_etcd_op_t ops[8];
  for (int i = 0; i < n; i++) {
    snprintf(keys[i], sizeof keys[i], "/wagma/agents/%s", agents[i]->name);
    ops[i] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_DELETE, .key = keys[i]};
  }
  assert_int_equal(wagma_etcd_txn(e->etcd, NULL, 0, ops, (size_t)n, NULL, 0, NULL), 0);
  for (int i = 0; i < n; i++)
    harness_agent_kill(e->etcd, agents[i]);
}

/* Registers two agents in one Txn under one lease (kept in a, b has none): they arrive in the
 * same scheduler pass. */
static void start_together(env_t *e, fake_agent_t *a, const char *na, fake_agent_t *b,
                           const char *nb) {
  char ka[96], kb[96], va[160], vb[160];
  memset(a, 0, sizeof *a);
  memset(b, 0, sizeof *b);
  snprintf(a->name, sizeof a->name, "%s", na);
  snprintf(b->name, sizeof b->name, "%s", nb);
  assert_int_equal(wagma_etcd_lease_grant(e->etcd, 10, &a->lease), 0);
  snprintf(ka, sizeof ka, "/wagma/agents/%s", na);
  snprintf(kb, sizeof kb, "/wagma/agents/%s", nb);
  snprintf(va, sizeof va, "{\"address\":\"127.0.0.1:7605\",\"device\":\"cpu\"}");
  snprintf(vb, sizeof vb, "{\"address\":\"127.0.0.1:7606\",\"device\":\"cpu\"}");
  wagma_etcd_op_t ops[2] = {
      {.type = WAGMA_ETCD_OP_PUT,
       .key = ka,
       .value = va,
       .value_len = strlen(va),
       .lease = a->lease},
      {.type = WAGMA_ETCD_OP_PUT,
       .key = kb,
       .value = vb,
       .value_len = strlen(vb),
       .lease = a->lease},
  };
  assert_int_equal(wagma_etcd_txn(e->etcd, NULL, 0, ops, 2, NULL, 0, NULL), 0);
  assert_int_equal(wagma_etcd_keepalive_start(e->etcd, a->lease, NULL, NULL, &a->ka), 0);
}

static void patch_workers(const coord_proc_t *c, const char *job, int workers) {
  char u[256], body[64];
  http_result_t r;
  snprintf(u, sizeof u, "%s/v1/jobs/%s", c->base, job);
  snprintf(body, sizeof body, "{\"workers\":%d}", workers);
  harness_http("PATCH", u, body, strlen(body), "application/json", NULL, &r);
  assert_int_equal(r.status, 200);
  harness_http_free(&r);
}

static void test_groups_follow_epochs(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t h[7];
  wagma_plan_t p1, p2, p3, p4;
  char u[256];
  http_result_t r;
  const char *job = "hist";
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "history", 3, NULL, NULL);
  for (int i = 0; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof name, "h%d", i);
    harness_agent_start(e->etcd, &h[i], name, 7600 + i, 10);
  }
  const char *spec = "{\"name\":\"hist\",\"workers\":4,\"min_workers\":1,\"group_size\":2,"
                     "\"staleness_bound\":4,\"iterations\":100000}";
  snprintf(u, sizeof u, "%s/v1/jobs", c.base);
  harness_http("POST", u, spec, strlen(spec), "application/json", NULL, &r);
  assert_int_equal(r.status, 201);
  harness_http_free(&r);

  /* Epoch 1: h0..h3 from round 0. */
  assert_true(harness_wait_epoch(c.base, job, 1, 10) >= 0);
  const char *m1[] = {"h0", "h1", "h2", "h3"};
  expected_plan(&p1, 1, 0, m1, 4);
  for (int i = 0; i < 4; i++)
    harness_progress(e->etcd, job, m1[i], 40, "running", 0.5);

  /* Epoch 2: h3 dies; h0..h2 from round 40. */
  harness_agent_kill(e->etcd, &h[3]);
  assert_true(harness_wait_epoch(c.base, job, 2, 10) >= 0);
  const char *m2[] = {"h0", "h1", "h2"};
  expected_plan(&p2, 2, 40, m2, 3);
  for (int i = 0; i < 3; i++)
    harness_progress(e->etcd, job, m2[i], 75, "running", 0.4);
  /* A late report of epoch 1 (h3 had counted on before it died): stale, it must not move
   * start_round nor the job's iteration. */
  harness_progress_epoch(e->etcd, job, "h3", 1, 90, "running", 0.4);

  /* Epoch 3: h4 arrives and joins; h0, h1, h2, h4 from round 75. */
  harness_agent_start(e->etcd, &h[4], "h4", 7604, 10);
  assert_true(harness_wait_epoch(c.base, job, 3, 10) >= 0);
  const char *m3[] = {"h0", "h1", "h2", "h4"};
  expected_plan(&p3, 3, 75, m3, 4);
  json_t *st = job_status(&c, job);
  assert_int_equal(int_of(st, "start_round"), 75);
  assert_int_equal(int_of(st, "iteration"), 75);
  json_decref(st);

  static const uint64_t in1[] = {0, 1, 2, 3, 7, 38, 39};
  static const uint64_t in2[] = {40, 41, 42, 43, 47, 74};
  static const uint64_t in3[] = {75, 76, 77, 78, 79, 80, 500};
  for (size_t i = 0; i < sizeof in1 / sizeof in1[0]; i++)
    expect_groups(&c, job, in1[i], &p1);
  for (size_t i = 0; i < sizeof in2 / sizeof in2[0]; i++)
    expect_groups(&c, job, in2[i], &p2);
  for (size_t i = 0; i < sizeof in3 / sizeof in3[0]; i++)
    expect_groups(&c, job, in3[i], &p3);
  uint64_t oldest = 0;
  assert_int_equal(history_keys(e, job, &oldest), 3);
  assert_int_equal(oldest, 1);

  /* Everyone dies; a checkpoint of iteration 60 is recorded: two new agents restart the job
   * from it, so epoch 4 starts at round 60, below epoch 3's 75. Rounds 60..74 and 75.. were
   * run again in epoch 4: the later epoch answers for them; 40..59 still belong to epoch 2. */
  const char *ck = "{\"path\":\"/nonexistent/hist.ckpt\",\"iteration\":60,\"epoch\":3,"
                   "\"agent\":\"h0\",\"time\":1700000000}";
  assert_int_equal(wagma_etcd_put(e->etcd, "/wagma/jobs/hist/checkpoint", ck, strlen(ck), 0, NULL),
                   0);
  fake_agent_t *const all3[] = {&h[0], &h[1], &h[2], &h[4]};
  kill_together(e, all3, 4);
  assert_true(harness_wait_state(c.base, job, "pending", 10) >= 0);
  assert_int_equal(harness_job_epoch(c.base, job), 3);
  start_together(e, &h[5], "h5", &h[6], "h6");
  assert_true(harness_wait_epoch(c.base, job, 4, 10) >= 0);
  const char *m4[] = {"h5", "h6"};
  expected_plan(&p4, 4, 60, m4, 2);
  st = job_status(&c, job);
  assert_int_equal(int_of(st, "start_round"), 60);
  assert_true(int_of(st, "iteration") >= 75); /* the job's iteration does not go back */
  json_decref(st);
  json_t *plan = get(&c, "/v1/jobs/hist/plan", 200);
  assert_int_equal(int_of(plan, "start_round"), 60);
  json_decref(plan);
  expect_groups(&c, job, 39, &p1);
  expect_groups(&c, job, 40, &p2);
  expect_groups(&c, job, 59, &p2);
  static const uint64_t in4[] = {60, 61, 63, 74, 75, 76, 1000};
  for (size_t i = 0; i < sizeof in4 / sizeof in4[0]; i++)
    expect_groups(&c, job, in4[i], &p4);
  /* Without ?iteration: the job's iteration (75) in the plan in effect there (epoch 4). */
  json_t *v = get(&c, "/v1/jobs/hist/groups", 200);
  assert_int_equal(int_of(v, "iteration"), 75);
  assert_int_equal(int_of(v, "epoch"), 4);
  json_decref(v);

  /* A round before every kept plan: 404 no_plan naming the iteration. */
  assert_int_equal(
      wagma_etcd_delete(e->etcd, "/wagma/jobs/hist/plans/00000000000000000001", 0, NULL, NULL), 0);
  v = get(&c, "/v1/jobs/hist/groups?iteration=39", 404);
  json_t *err = json_object_get(v, "error");
  assert_string_equal(json_string_value(json_object_get(err, "code")), "no_plan");
  assert_string_equal(json_string_value(json_object_get(err, "field")), "iteration");
  json_decref(v);
  expect_groups(&c, job, 40, &p2);

  /* The history is bounded: after 32 more epochs only the last WAGMA_API_PLAN_HISTORY are
   * kept (h5 alone, then h5 + h6, ...). */
  uint64_t epoch = 4;
  for (int k = 0; k < WAGMA_API_PLAN_HISTORY; k++) {
    patch_workers(&c, job, k % 2 == 0 ? 1 : 2);
    assert_true(harness_wait_epoch(c.base, job, (long long)++epoch, 10) >= 0);
  }
  assert_int_equal(history_keys(e, job, &oldest), WAGMA_API_PLAN_HISTORY);
  assert_int_equal(oldest, epoch - WAGMA_API_PLAN_HISTORY + 1);
  json_decref(get(&c, "/v1/jobs/hist/groups?iteration=59", 404));
  v = get(&c, "/v1/jobs/hist/groups?iteration=60", 200);
  assert_int_equal(int_of(v, "epoch"), epoch);
  json_decref(v);

  /* Stopped and purged: the history goes with the job. */
  snprintf(u, sizeof u, "%s/v1/jobs/hist", c.base);
  harness_http("DELETE", u, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  harness_http_free(&r);
  snprintf(u, sizeof u, "%s/v1/jobs/hist?purge=true", c.base);
  harness_http("DELETE", u, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 204);
  harness_http_free(&r);
  assert_int_equal(history_keys(e, job, NULL), 0);

  wagma_plan_free(&p1);
  wagma_plan_free(&p2);
  wagma_plan_free(&p3);
  wagma_plan_free(&p4);
  harness_agent_kill(e->etcd, &h[5]); /* h6 shares its lease */
  harness_coord_stop(&c, SIGTERM);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_groups_follow_epochs, harness_group_setup,
                                      harness_group_teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
