/* Integration tests of wagma-coordinator: a real etcd (tests/support fixture), real
 * coordinator processes started and stopped by PID, libcurl as the client, agents faked as
 * leased registration keys. Built twice: test_coordinator (generous time bounds) and
 * test_coordinator_timing (label timing: the bounds of the design, e.g. a lease expiry gives
 * a new plan within TTL + 1 s). */
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
#include "wagma/etcd.h"

#ifdef STRICT_TIMING
#define SLACK 0.0
#else
#define SLACK 4.0
#endif

typedef harness_env_t env_t;

static const char *url(const coord_proc_t *p, const char *path, char *buf, size_t len) {
  snprintf(buf, len, "%s%s", p->base, path);
  return buf;
}

/* Sends a request and checks the status; returns the parsed JSON body (may be NULL). */
static json_t *call(const coord_proc_t *p, const char *method, const char *path, const char *body,
                    const char *token, long want) {
  char u[256];
  http_result_t r;
  harness_http(method, url(p, path, u, sizeof u), body, body ? strlen(body) : 0,
               body ? "application/json" : NULL, token, &r);
  if (r.status != want)
    fail_msg("%s %s: status %ld, want %ld: %s", method, path, r.status, want, r.body);
  json_t *v = json_loads(r.body, 0, NULL);
  harness_http_free(&r);
  return v;
}

/* Checks an error response: status, error.code and error.field (NULL = no field). */
static void expect_error(const coord_proc_t *p, const char *method, const char *path,
                         const char *body, const char *content_type, const char *token, long status,
                         const char *code, const char *field) {
  char u[256];
  http_result_t r;
  harness_http(method, url(p, path, u, sizeof u), body, body ? strlen(body) : 0, content_type,
               token, &r);
  if (r.status != status)
    fail_msg("%s %s: status %ld, want %ld: %s", method, path, r.status, status, r.body);
  if (strcmp(method, "HEAD") != 0) {
    json_t *v = json_loads(r.body, 0, NULL);
    json_t *err = json_object_get(v, "error");
    if (!err)
      fail_msg("%s %s: no error body: %s", method, path, r.body);
    assert_string_equal(json_string_value(json_object_get(err, "code")), code);
    assert_true(json_is_string(json_object_get(err, "message")));
    if (field)
      assert_string_equal(json_string_value(json_object_get(err, "field")), field);
    json_decref(v);
  }
  if (status == 405)
    assert_true(strlen(r.allow) > 0);
  if (status == 401)
    assert_true(r.www_authenticate);
  harness_http_free(&r);
}

static json_t *job_status(const coord_proc_t *p, const char *job) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  return call(p, "GET", path, NULL, NULL, 200);
}

static const char *member_name(json_t *job, size_t i) {
  return json_string_value(
      json_object_get(json_array_get(json_object_get(job, "members"), i), "name"));
}

static void test_lifecycle(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t a0, a1, a2;
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "life", 3, NULL, NULL);

  json_t *v =
      call(&c, "POST", "/v1/jobs",
           "{\"name\":\"life\",\"workers\":2,\"max_workers\":4,\"iterations\":50}", NULL, 201);
  assert_string_equal(json_string_value(json_object_get(json_object_get(v, "status"), "state")),
                      "pending");
  json_decref(v);

  harness_agent_start(e->etcd, &a0, "a0", 7000, 5);
  harness_agent_start(e->etcd, &a1, "a1", 7001, 5);
  assert_true(harness_wait_epoch(c.base, "life", 1, 5 + SLACK) >= 0);
  v = job_status(&c, "life");
  assert_string_equal(json_string_value(json_object_get(json_object_get(v, "status"), "state")),
                      "running");
  assert_int_equal(json_array_size(json_object_get(v, "members")), 2);
  assert_string_equal(member_name(v, 0), "a0");
  assert_string_equal(member_name(v, 1), "a1");
  json_decref(v);

  /* Agents show their job; the plan is what agents read. */
  v = call(&c, "GET", "/v1/agents", NULL, NULL, 200);
  json_t *agents = json_object_get(v, "agents");
  assert_int_equal(json_array_size(agents), 2);
  for (size_t i = 0; i < 2; i++)
    assert_string_equal(json_string_value(json_object_get(json_array_get(agents, i), "job")),
                        "life");
  json_decref(v);
  v = call(&c, "GET", "/v1/jobs/life/plan", NULL, NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(v, "epoch")), 1);
  assert_int_equal(json_array_size(json_object_get(v, "members")), 2);
  json_decref(v);

  /* Live scaling: a third agent arrives, PATCH workers 3 -> epoch 2 with a joiner. */
  harness_agent_start(e->etcd, &a2, "a2", 7002, 5);
  harness_sleep(0.3);
  assert_int_equal(harness_job_epoch(c.base, "life"), 1); /* workers is still 2 */
  json_decref(call(&c, "PATCH", "/v1/jobs/life", "{\"workers\":3}", NULL, 200));
  assert_true(harness_wait_epoch(c.base, "life", 2, 3 + SLACK) >= 0);
  v = call(&c, "GET", "/v1/jobs/life/plan", NULL, NULL, 200);
  json_t *members = json_object_get(v, "members");
  assert_int_equal(json_array_size(members), 3);
  assert_true(json_is_false(json_object_get(json_array_get(members, 0), "joiner")));
  assert_true(json_is_true(json_object_get(json_array_get(members, 2), "joiner")));
  assert_string_equal(json_string_value(json_object_get(json_array_get(members, 2), "name")), "a2");
  json_decref(v);

  /* Progress shows up per member; groups of a round. */
  harness_progress(e->etcd, "life", "a0", 20, "running", 0.5);
  v = job_status(&c, "life");
  assert_int_equal(
      json_integer_value(json_object_get(
          json_object_get(json_array_get(json_object_get(v, "members"), 0), "progress"),
          "iteration")),
      20);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(v, "status"), "iteration")),
                   20);
  assert_true(
      json_is_null(json_object_get(json_array_get(json_object_get(v, "members"), 1), "progress")));
  json_decref(v);
  v = call(&c, "GET", "/v1/jobs/life/groups?iteration=7", NULL, NULL, 200);
  assert_string_equal(json_string_value(json_object_get(v, "kind")), "global"); /* (7+1)%8 */
  assert_int_equal(json_array_size(json_object_get(v, "groups")), 1);
  json_decref(v);
  v = call(&c, "GET", "/v1/jobs/life/groups?iteration=3", NULL, NULL, 200);
  assert_string_equal(json_string_value(json_object_get(v, "kind")), "group");
  assert_int_equal(json_integer_value(json_object_get(v, "iteration")), 3);
  json_decref(v);
  v = call(&c, "GET", "/v1/jobs/life/groups", NULL, NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(v, "iteration")), 20);
  json_decref(v);

  /* Completion: every member reports done -> succeeded, agents released. */
  harness_progress(e->etcd, "life", "a0", 50, "done", 0.1);
  harness_progress(e->etcd, "life", "a1", 50, "done", 0.1);
  harness_sleep(0.3);
  char st[32];
  assert_string_equal(harness_job_state(c.base, "life", st, sizeof st), "running");
  harness_progress(e->etcd, "life", "a2", 50, "done", 0.1);
  assert_true(harness_wait_state(c.base, "life", "succeeded", 3 + SLACK) >= 0);
  double t0 = harness_now();
  int released = 0;
  while (!released && harness_now() - t0 < 3 + SLACK) {
    v = call(&c, "GET", "/v1/agents", NULL, NULL, 200);
    released = 1;
    json_t *ag;
    size_t i;
    json_array_foreach(json_object_get(v, "agents"), i, ag) released &=
        json_is_null(json_object_get(ag, "job"));
    json_decref(v);
    if (!released)
      harness_sleep(0.05);
  }
  assert_true(released);

  /* Metrics show the job. */
  char u[256];
  http_result_t r;
  harness_http("GET", url(&c, "/metrics", u, sizeof u), NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.content_type, "text/plain"));
  assert_non_null(strstr(r.body, "wagma_jobs{state=\"succeeded\"} 1"));
  assert_non_null(strstr(r.body, "wagma_plan_epoch{job=\"life\"} 2"));
  assert_non_null(strstr(r.body, "wagma_job_staleness{job=\"life\"} 1")); /* the members' */
  assert_non_null(strstr(r.body, "wagma_http_request_duration_seconds_bucket"));
  assert_non_null(strstr(r.body, "wagma_agents 3"));
  harness_http_free(&r);

  /* Finished: stop is a conflict, purge removes it. */
  expect_error(&c, "DELETE", "/v1/jobs/life", NULL, NULL, NULL, 409, "finished", NULL);
  json_decref(call(&c, "DELETE", "/v1/jobs/life?purge=true", NULL, NULL, 204));
  expect_error(&c, "GET", "/v1/jobs/life", NULL, NULL, NULL, 404, "not_found", NULL);

  harness_agent_kill(e->etcd, &a0);
  harness_agent_kill(e->etcd, &a1);
  harness_agent_kill(e->etcd, &a2);
  harness_coord_stop(&c, SIGTERM);
}

static void test_lease_expiry(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t b[3];
  const int ttl = 2;
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "expiry", 3, NULL, NULL);
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "b%d", i);
    harness_agent_start(e->etcd, &b[i], name, 7100 + i, ttl);
  }
  json_decref(call(&c, "POST", "/v1/jobs",
                   "{\"name\":\"exp\",\"workers\":3,\"min_workers\":2,\"iterations\":1000}", NULL,
                   201));
  assert_true(harness_wait_epoch(c.base, "exp", 1, 5 + SLACK) >= 0);
  json_t *v = job_status(&c, "exp");
  assert_int_equal(json_array_size(json_object_get(v, "members")), 3);
  json_decref(v);
  harness_progress(e->etcd, "exp", "b0", 30, "running", 1.0);
  harness_progress(e->etcd, "exp", "b1", 28, "running", 1.0);

  /* b2 freezes: its lease expires after at most TTL; a new plan follows within 1 s. */
  harness_agent_freeze(&b[2]);
  double took = harness_wait_epoch(c.base, "exp", 2, ttl + 6);
  print_message("lease expiry -> plan epoch 2 after %.2f s (ttl %d s)\n", took, ttl);
  assert_true(took >= 0);
  assert_true(took <= ttl + 1.0 + SLACK);
  v = call(&c, "GET", "/v1/jobs/exp/plan", NULL, NULL, 200);
  assert_int_equal(json_array_size(json_object_get(v, "members")), 2);
  assert_int_equal(json_integer_value(json_object_get(v, "start_round")), 30);
  json_t *m;
  size_t i;
  json_array_foreach(json_object_get(v, "members"), i, m) {
    assert_true(json_is_false(json_object_get(m, "joiner")));
    assert_string_not_equal(json_string_value(json_object_get(m, "name")), "b2");
  }
  json_decref(v);
  v = job_status(&c, "exp");
  json_t *st = json_object_get(v, "status");
  assert_int_equal(json_integer_value(json_object_get(st, "regroupings")), 1);
  assert_int_equal(json_integer_value(json_object_get(st, "start_round")), 30);
  json_decref(v);

  /* Below min_workers the survivors keep training; losing all makes the job pending. */
  harness_agent_kill(e->etcd, &b[1]);
  assert_true(harness_wait_epoch(c.base, "exp", 3, 3 + SLACK) >= 0);
  harness_agent_kill(e->etcd, &b[0]);
  assert_true(harness_wait_state(c.base, "exp", "pending", 3 + SLACK) >= 0);

  /* New agents restart it where the lost members had got to, with nobody as joiner. */
  fake_agent_t n[2];
  harness_agent_start(e->etcd, &n[0], "b3", 7103, 10);
  harness_agent_start(e->etcd, &n[1], "b4", 7104, 10);
  assert_true(harness_wait_epoch(c.base, "exp", 4, 3 + SLACK) >= 0);
  v = call(&c, "GET", "/v1/jobs/exp/plan", NULL, NULL, 200);
  assert_int_equal(json_array_size(json_object_get(v, "members")), 2);
  assert_int_equal(json_integer_value(json_object_get(v, "start_round")), 30);
  json_array_foreach(json_object_get(v, "members"), i, m)
      assert_true(json_is_false(json_object_get(m, "joiner")));
  json_decref(v);
  harness_agent_kill(e->etcd, &n[0]);
  harness_agent_kill(e->etcd, &n[1]);
  harness_coord_stop(&c, SIGTERM);
}

static void test_restart(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t a[3];
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "first", 2, NULL, NULL);
  json_decref(call(&c, "POST", "/v1/jobs", "{\"name\":\"rs\",\"workers\":2}", NULL, 201));
  harness_agent_start(e->etcd, &a[0], "c0", 7200, 10);
  harness_agent_start(e->etcd, &a[1], "c1", 7201, 10);
  assert_true(harness_wait_epoch(c.base, "rs", 1, 5 + SLACK) >= 0);

  /* The coordinator dies; membership changes while it is down. */
  harness_coord_stop(&c, SIGKILL);
  harness_agent_kill(e->etcd, &a[1]);
  harness_agent_start(e->etcd, &a[2], "c2", 7202, 10);

  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "second", 2, NULL, NULL);
  /* The old leader key expires (TTL 2), the new one leads and resumes from etcd. */
  assert_true(harness_wait_epoch(c.base, "rs", 2, 8 + SLACK) >= 0);
  json_t *v = call(&c, "GET", "/v1/jobs", NULL, NULL, 200);
  assert_int_equal(json_array_size(json_object_get(v, "jobs")), 1);
  json_decref(v);
  v = job_status(&c, "rs");
  assert_string_equal(member_name(v, 0), "c0");
  assert_string_equal(member_name(v, 1), "c2");
  assert_true(
      json_is_true(json_object_get(json_array_get(json_object_get(v, "members"), 1), "joiner")));
  json_decref(v);
  /* Stop the job: agents are released, the job is not resurrected by a restart. */
  json_decref(call(&c, "DELETE", "/v1/jobs/rs", NULL, NULL, 200));
  harness_coord_stop(&c, SIGTERM);
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "third", 2, NULL, NULL);
  harness_sleep(1.0);
  char st[32];
  assert_string_equal(harness_job_state(c.base, "rs", st, sizeof st), "stopped");
  harness_coord_stop(&c, SIGTERM);
  harness_agent_kill(e->etcd, &a[0]);
  harness_agent_kill(e->etcd, &a[2]);
}

static void put_agent_device(env_t *e, fake_agent_t *a, const char *name, int port,
                             const char *device) {
  char key[128], val[160];
  memset(a, 0, sizeof *a);
  snprintf(a->name, sizeof a->name, "%s", name);
  assert_int_equal(wagma_etcd_lease_grant(e->etcd, 10, &a->lease), 0);
  snprintf(key, sizeof key, "/wagma/agents/%s", name);
  snprintf(val, sizeof val, "{\"address\":\"127.0.0.1:%d\",\"device\":\"%s\"}", port, device);
  assert_int_equal(wagma_etcd_put(e->etcd, key, val, strlen(val), a->lease, NULL), 0);
  assert_int_equal(wagma_etcd_keepalive_start(e->etcd, a->lease, NULL, NULL, &a->ka), 0);
}

static int count_assignments(env_t *e, const char *job) {
  wagma_etcd_range_t r = {0};
  wagma_etcd_range_options_t o = {.prefix = 1};
  int n = 0;
  assert_int_equal(wagma_etcd_range(e->etcd, "/wagma/assignments/", &o, &r), 0);
  for (size_t i = 0; i < r.n; i++) {
    char want[96];
    snprintf(want, sizeof want, "\"job\":\"%s\"", job);
    n += strstr(r.kvs[i].value, want) != NULL;
  }
  wagma_etcd_range_free(&r);
  return n;
}

static void test_scheduling(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t g[5];
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "sched", 3, NULL, NULL);
  /* Two jobs wait; the older one gets the agents first (FIFO). */
  json_decref(call(&c, "POST", "/v1/jobs", "{\"name\":\"old\",\"workers\":3,\"min_workers\":2}",
                   NULL, 201));
  harness_sleep(0.05);
  json_decref(call(&c, "POST", "/v1/jobs", "{\"name\":\"gpu\",\"workers\":1,\"device\":\"cuda\"}",
                   NULL, 201));
  put_agent_device(e, &g[0], "g0", 7500, "cpu");
  put_agent_device(e, &g[1], "g1", 7501, "cpu");
  assert_true(harness_wait_epoch(c.base, "old", 1, 5 + SLACK) >= 0);
  /* A cuda agent goes to the cuda job even though "old" still wants a third worker... */
  put_agent_device(e, &g[2], "g2", 7502, "cuda");
  assert_true(harness_wait_epoch(c.base, "gpu", 1, 3 + SLACK) >= 0);
  json_t *v = job_status(&c, "gpu");
  assert_string_equal(member_name(v, 0), "g2");
  json_decref(v);
  /* ...and a cpu agent never goes to the cuda job. */
  put_agent_device(e, &g[3], "g3", 7503, "cpu");
  assert_true(harness_wait_epoch(c.base, "old", 2, 3 + SLACK) >= 0);
  v = job_status(&c, "old");
  assert_int_equal(json_array_size(json_object_get(v, "members")), 3);
  assert_string_equal(member_name(v, 2), "g3");
  json_decref(v);
  assert_int_equal(count_assignments(e, "old"), 3);

  /* Scale down: the highest rank leaves, its assignment is released. */
  json_decref(call(&c, "PATCH", "/v1/jobs/old", "{\"workers\":2}", NULL, 200));
  assert_true(harness_wait_epoch(c.base, "old", 3, 3 + SLACK) >= 0);
  v = job_status(&c, "old");
  assert_int_equal(json_array_size(json_object_get(v, "members")), 2);
  assert_string_equal(member_name(v, 0), "g0");
  assert_string_equal(member_name(v, 1), "g1");
  json_decref(v);
  double t0 = harness_now();
  while (count_assignments(e, "old") != 2 && harness_now() - t0 < 3 + SLACK)
    harness_sleep(0.05);
  assert_int_equal(count_assignments(e, "old"), 2);

  /* An agent that re-registers with another address left and comes back as a joiner. */
  char val[96];
  snprintf(val, sizeof val, "{\"address\":\"127.0.0.1:7999\"}");
  assert_int_equal(wagma_etcd_put(e->etcd, "/wagma/agents/g1", val, strlen(val), g[1].lease, NULL),
                   0);
  assert_true(harness_wait_epoch(c.base, "old", 4, 3 + SLACK) >= 0);
  v = call(&c, "GET", "/v1/jobs/old/plan", NULL, NULL, 200);
  json_t *m;
  size_t i;
  int found = 0;
  json_array_foreach(json_object_get(v, "members"), i, m) {
    if (strcmp(json_string_value(json_object_get(m, "name")), "g1") == 0) {
      found = 1;
      assert_string_equal(json_string_value(json_object_get(m, "address")), "127.0.0.1:7999");
      assert_true(json_is_true(json_object_get(m, "joiner")));
    }
  }
  assert_true(found);
  json_decref(v);

  /* A member that reports failure fails the job; its agents are released. */
  harness_progress(e->etcd, "old", "g0", 7, "failed", 1.0);
  assert_true(harness_wait_state(c.base, "old", "failed", 3 + SLACK) >= 0);
  v = job_status(&c, "old");
  assert_non_null(
      strstr(json_string_value(json_object_get(json_object_get(v, "status"), "reason")), "g0"));
  json_decref(v);
  t0 = harness_now();
  while (count_assignments(e, "old") != 0 && harness_now() - t0 < 3 + SLACK)
    harness_sleep(0.05);
  assert_int_equal(count_assignments(e, "old"), 0);

  /* A stale assignment (job unknown) is deleted. */
  const char *stale = "{\"job\":\"ghost\",\"epoch\":1}";
  assert_int_equal(wagma_etcd_put(e->etcd, "/wagma/assignments/g4", stale, strlen(stale), 0, NULL),
                   0);
  t0 = harness_now();
  while (count_assignments(e, "ghost") != 0 && harness_now() - t0 < 3 + SLACK)
    harness_sleep(0.05);
  assert_int_equal(count_assignments(e, "ghost"), 0);

  for (int k = 0; k < 4; k++)
    harness_agent_kill(e->etcd, &g[k]);
  harness_coord_stop(&c, SIGTERM);
}

static int is_leader(const coord_proc_t *p) {
  char u[256];
  long status = 0;
  json_t *v = harness_get_json(url(p, "/healthz", u, sizeof u), &status);
  int l = status == 200 && json_is_true(json_object_get(v, "leader"));
  json_decref(v);
  return l;
}

static void test_failover(void **state) {
  env_t *e = *state;
  coord_proc_t c[2];
  fake_agent_t a[3];
  const int ttl = 2;
  harness_coord_start(&c[0], etcd_fixture_endpoints(e->fx), "coord-a", ttl, NULL, NULL);
  harness_coord_start(&c[1], etcd_fixture_endpoints(e->fx), "coord-b", ttl, NULL, NULL);
  double t0 = harness_now();
  int leader = -1;
  while (harness_now() - t0 < 5 && leader < 0) {
    int l0 = is_leader(&c[0]), l1 = is_leader(&c[1]);
    assert_false(l0 && l1);
    leader = l0 ? 0 : l1 ? 1 : -1;
    harness_sleep(0.05);
  }
  assert_true(leader >= 0);
  int follower = 1 - leader;

  /* The follower serves reads and accepts mutations (they are etcd transactions). */
  json_decref(call(&c[follower], "POST", "/v1/jobs", "{\"name\":\"fo\",\"workers\":2}", NULL, 201));
  harness_agent_start(e->etcd, &a[0], "d0", 7300, 10);
  harness_agent_start(e->etcd, &a[1], "d1", 7301, 10);
  assert_true(harness_wait_epoch(c[follower].base, "fo", 1, 5 + SLACK) >= 0);

  harness_coord_stop(&c[leader], SIGKILL);
  t0 = harness_now();
  while (!is_leader(&c[follower]) && harness_now() - t0 < ttl + 10)
    harness_sleep(0.05);
  double took = harness_now() - t0;
  print_message("failover: follower leads after %.2f s (ttl %d s)\n", took, ttl);
  assert_true(is_leader(&c[follower]));
  assert_true(took <= ttl + 1.0 + SLACK);

  /* The new leader schedules. */
  harness_agent_start(e->etcd, &a[2], "d2", 7302, 10); /* free: the job is full */
  harness_sleep(0.3);
  harness_agent_kill(e->etcd, &a[1]);
  assert_true(harness_wait_epoch(c[follower].base, "fo", 2, 3 + SLACK) >= 0);
  json_t *v = job_status(&c[follower], "fo");
  assert_string_equal(member_name(v, 0), "d0");
  assert_string_equal(member_name(v, 1), "d2");
  json_decref(v);
  harness_coord_stop(&c[follower], SIGTERM);
  harness_agent_kill(e->etcd, &a[0]);
  harness_agent_kill(e->etcd, &a[2]);
}

/* WAGMA_TOKEN set but empty is a misconfiguration (exit 2), never "run without a token". */
static void test_empty_token_refused(void **state) {
  env_t *e = *state;
  char out[1024];
  const char *const env[] = {"WAGMA_TOKEN= \n", NULL};
  int code = harness_coord_refused(etcd_fixture_endpoints(e->fx), env, out, sizeof out);
  if (code != 2 || !strstr(out, "WAGMA_TOKEN is set but empty"))
    fail_msg("want exit 2 and a clear error, got %d: %s", code, out);
}

static void test_errors(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  const char *tok = "s3cret";
  const char *extra[] = {"--max-body", "1024", NULL};
  /* WAGMA_TOKEN as a mounted secret often has it: a trailing newline, which no client sends */
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "errors", 3, "s3cret\n", extra);
  const char *ok = "{\"name\":\"err\",\"workers\":2}";

  expect_error(&c, "POST", "/v1/jobs", ok, "application/json", NULL, 401, "unauthorized", NULL);
  expect_error(&c, "POST", "/v1/jobs", ok, "application/json", "wrong", 401, "unauthorized", NULL);
  expect_error(&c, "POST", "/v1/jobs", ok, "text/plain", tok, 415, "unsupported_media_type", NULL);
  expect_error(&c, "POST", "/v1/jobs", ok, NULL, tok, 415, "unsupported_media_type", NULL);
  expect_error(&c, "POST", "/v1/jobs", "{\"workers\":", "application/json", tok, 400, "bad_json",
               NULL);
  expect_error(&c, "POST", "/v1/jobs", "{\"workers\":2,\"optimizer\":{\"lr\":-1}}",
               "application/json", tok, 422, "invalid_spec", "optimizer.lr");
  expect_error(&c, "POST", "/v1/jobs", "{\"workers\":2,\"color\":1}", "application/json", tok, 422,
               "invalid_spec", "color");
  char big[2048];
  memset(big, ' ', sizeof big - 1);
  big[0] = '{';
  big[sizeof big - 2] = '}';
  big[sizeof big - 1] = '\0';
  expect_error(&c, "POST", "/v1/jobs", big, "application/json", tok, 413, "too_large", NULL);

  char u[256];
  http_result_t r;
  harness_http("POST", url(&c, "/v1/jobs", u, sizeof u), ok, strlen(ok),
               "application/json; charset=utf-8", tok, &r);
  assert_int_equal(r.status, 201);
  assert_string_equal(r.location, "/v1/jobs/err");
  harness_http_free(&r);
  expect_error(&c, "POST", "/v1/jobs", ok, "application/json", tok, 409, "exists", "name");

  expect_error(&c, "GET", "/v1/nothing", NULL, NULL, NULL, 404, "not_found", NULL);
  expect_error(&c, "GET", "/v1/jobs/", NULL, NULL, NULL, 404, "not_found", NULL);
  expect_error(&c, "GET", "/v1/jobs/missing", NULL, NULL, NULL, 404, "not_found", NULL);
  expect_error(&c, "GET", "/v1/jobs/missing/plan", NULL, NULL, NULL, 404, "not_found", NULL);
  expect_error(&c, "GET", "/v1/jobs/err/plan", NULL, NULL, NULL, 404, "no_plan", NULL);
  expect_error(&c, "GET", "/v1/jobs/err/groups", NULL, NULL, NULL, 404, "no_plan", NULL);
  expect_error(&c, "GET", "/v1/jobs/err/groups?iteration=abc", NULL, NULL, NULL, 400, "bad_request",
               "iteration");
  expect_error(&c, "GET", "/v1/jobs/err/groups?iteration=9223372036854775808", NULL, NULL, NULL,
               400, "bad_request", "iteration");
  expect_error(&c, "GET", "/v1/jobs?state=bogus", NULL, NULL, NULL, 400, "bad_request", "state");
  expect_error(&c, "PUT", "/v1/jobs", ok, "application/json", tok, 405, "method_not_allowed", NULL);
  expect_error(&c, "DELETE", "/healthz", NULL, NULL, tok, 405, "method_not_allowed", NULL);
  expect_error(&c, "POST", "/v1/jobs/err/plan", "{}", "application/json", tok, 405,
               "method_not_allowed", NULL);

  expect_error(&c, "PATCH", "/v1/jobs/err", "{\"model\":\"mlp\"}", "application/json", tok, 422,
               "invalid_patch", "model");
  expect_error(&c, "PATCH", "/v1/jobs/err", "{\"workers\":99}", "application/json", tok, 422,
               "invalid_patch", "workers");
  expect_error(&c, "PATCH", "/v1/jobs/err", "{\"workers\":2}", "application/json", NULL, 401,
               "unauthorized", NULL);
  expect_error(&c, "PATCH", "/v1/jobs/nope", "{\"workers\":2}", "application/json", tok, 404,
               "not_found", NULL);
  expect_error(&c, "DELETE", "/v1/jobs/err?purge=maybe", NULL, NULL, tok, 400, "bad_request",
               "purge");
  expect_error(&c, "DELETE", "/v1/jobs/err?purge=true", NULL, NULL, tok, 409, "active", NULL);
  /* A ninth parameter is refused, never dropped: here the dropped one would be a bad limit,
   * or purge (which would turn a purge into a plain stop). */
  expect_error(&c, "GET", "/v1/jobs?a&b&c&d&e&f&g&h&limit=abc", NULL, NULL, NULL, 400,
               "bad_request", NULL);
  expect_error(&c, "DELETE", "/v1/jobs/err?a&b&c&d&e&f&g&h&purge=true", NULL, NULL, tok, 400,
               "bad_request", NULL);

  /* Reads need no token. */
  json_decref(call(&c, "GET", "/v1/jobs", NULL, NULL, 200));
  json_t *v = call(&c, "DELETE", "/v1/jobs/err", NULL, tok, 200);
  assert_string_equal(json_string_value(json_object_get(json_object_get(v, "status"), "state")),
                      "stopped");
  json_decref(v);
  expect_error(&c, "PATCH", "/v1/jobs/err", "{\"workers\":1}", "application/json", tok, 409,
               "finished", NULL);
  expect_error(&c, "DELETE", "/v1/jobs/err", NULL, NULL, tok, 409, "finished", NULL);
  json_decref(call(&c, "DELETE", "/v1/jobs/err?purge=true", NULL, tok, 204));

  /* etcd down: 503 on readiness and on reads; back up: 200 again. */
  assert_int_equal(etcd_fixture_kill(e->fx, 0), 0);
  expect_error(&c, "GET", "/readyz", NULL, NULL, NULL, 503, "unavailable", NULL);
  expect_error(&c, "GET", "/v1/jobs", NULL, NULL, NULL, 503, "unavailable", NULL);
  json_decref(call(&c, "GET", "/healthz", NULL, NULL, 200));
  assert_int_equal(etcd_fixture_restart(e->fx, 0), 0);
  double t0 = harness_now();
  long st = 0;
  while (harness_now() - t0 < 30 && st != 200) {
    json_decref(harness_get_json(url(&c, "/readyz", u, sizeof u), &st));
    if (st != 200)
      harness_sleep(0.1);
  }
  assert_int_equal(st, 200);
  harness_coord_stop(&c, SIGTERM);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lifecycle, harness_group_setup, harness_group_teardown),
      cmocka_unit_test_setup_teardown(test_lease_expiry, harness_group_setup,
                                      harness_group_teardown),
      cmocka_unit_test_setup_teardown(test_restart, harness_group_setup, harness_group_teardown),
      cmocka_unit_test_setup_teardown(test_scheduling, harness_group_setup, harness_group_teardown),
      cmocka_unit_test_setup_teardown(test_failover, harness_group_setup, harness_group_teardown),
      cmocka_unit_test_setup_teardown(test_errors, harness_group_setup, harness_group_teardown),
      cmocka_unit_test_setup_teardown(test_empty_token_refused, harness_group_setup,
                                      harness_group_teardown),
  };
  if (getenv("TEST_FILTER")) /* e.g. TEST_FILTER=test_errors */
    cmocka_set_test_filter(getenv("TEST_FILTER"));
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
