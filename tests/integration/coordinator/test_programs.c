/* Integration test of program jobs in wagma-coordinator (issue 25): a real etcd, a real
 * coordinator, agents faked as leased registration keys that list their programs. A program
 * job goes only to agents that have its program (an agent without it stays free even when it
 * is the only one), and waits with a reason that names the program; the REST API refuses a
 * program name that could be a path, and shows the program in the job and the agents. */
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

typedef harness_env_t env_t;

/* Sends a request and checks the status; returns the parsed JSON body (may be NULL). */
static json_t *call(const coord_proc_t *p, const char *method, const char *path, const char *body,
                    long want) {
  char u[256];
  http_result_t r;
  snprintf(u, sizeof u, "%s%s", p->base, path);
  harness_http(method, u, body, body ? strlen(body) : 0, body ? "application/json" : NULL, NULL,
               &r);
  if (r.status != want)
    fail_msg("%s %s: status %ld, want %ld: %s", method, path, r.status, want, r.body);
  json_t *v = json_loads(r.body, 0, NULL);
  harness_http_free(&r);
  return v;
}

/* A 422 whose error names field (and whose message holds words, when not NULL). */
static void expect_422(const coord_proc_t *p, const char *method, const char *path,
                       const char *body, const char *code, const char *field, const char *words) {
  json_t *v = call(p, method, path, body, 422);
  json_t *err = json_object_get(v, "error");
  assert_string_equal(json_string_value(json_object_get(err, "code")), code);
  assert_string_equal(json_string_value(json_object_get(err, "field")), field);
  if (words && !strstr(json_string_value(json_object_get(err, "message")), words))
    fail_msg("%s: message without '%s'", json_string_value(json_object_get(err, "message")), words);
  json_decref(v);
}

/* A fake agent whose registration lists programs (a JSON array, NULL = no "programs"). */
static void put_agent(env_t *e, fake_agent_t *a, const char *name, int port, const char *device,
                      const char *programs) {
  char key[128], val[256];
  memset(a, 0, sizeof *a);
  snprintf(a->name, sizeof a->name, "%s", name);
  assert_int_equal(wagma_etcd_lease_grant(e->etcd, 10, &a->lease), 0);
  snprintf(key, sizeof key, "/wagma/agents/%s", name);
  snprintf(val, sizeof val, "{\"address\":\"127.0.0.1:%d\",\"device\":\"%s\"%s%s}", port, device,
           programs ? ",\"programs\":" : "", programs ? programs : "");
  assert_int_equal(wagma_etcd_put(e->etcd, key, val, strlen(val), a->lease, NULL), 0);
  assert_int_equal(wagma_etcd_keepalive_start(e->etcd, a->lease, NULL, NULL, &a->ka), 0);
}

/* The job's status field key (a string), into buf. */
static const char *status_str(const coord_proc_t *p, const char *job, const char *key, char *buf,
                              size_t len) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  json_t *v = call(p, "GET", path, NULL, 200);
  snprintf(buf, len, "%s",
           json_string_value(json_object_get(json_object_get(v, "status"), key)) ?: "");
  json_decref(v);
  return buf;
}

/* Waits (up to timeout s) until the job's status reason is want; fails with the last one. */
static void wait_reason(const coord_proc_t *p, const char *job, const char *want, double timeout) {
  char reason[256] = "";
  double t0 = harness_now();
  while (harness_now() - t0 < timeout) {
    if (strcmp(status_str(p, job, "reason", reason, sizeof reason), want) == 0)
      return;
    harness_sleep(0.05);
  }
  fail_msg("job %s: reason '%s', want '%s'", job, reason, want);
}

/* The job an agent is assigned to in GET /v1/agents ("" when free), and its programs. */
static const char *agent_job(const coord_proc_t *p, const char *agent, char *buf, size_t len,
                             json_t **programs) {
  json_t *v = call(p, "GET", "/v1/agents", NULL, 200);
  json_t *ag;
  size_t i;
  buf[0] = '\0';
  json_array_foreach(json_object_get(v, "agents"), i, ag) {
    if (strcmp(json_string_value(json_object_get(ag, "name")), agent) != 0)
      continue;
    snprintf(buf, len, "%s", json_string_value(json_object_get(ag, "job")) ?: "");
    if (programs)
      *programs = json_incref(json_object_get(ag, "programs"));
  }
  json_decref(v);
  return buf;
}

static void test_program_scheduling(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t a0, a1, g0;
  char buf[256];
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "prog", 3, NULL, NULL);

  /* Bad programs are refused before anything is stored. */
  expect_422(&c, "POST", "/v1/jobs", "{\"workers\":1,\"program\":{\"name\":\"../x\"}}",
             "invalid_spec", "program.name", NULL);
  expect_422(&c, "POST", "/v1/jobs", "{\"workers\":1,\"program\":{\"name\":\"a/b\"}}",
             "invalid_spec", "program.name", NULL);
  expect_422(&c, "POST", "/v1/jobs",
             "{\"workers\":1,\"model\":\"mlp\",\"program\":{\"name\":\"p1\"}}", "invalid_spec",
             "model", "a program job has no built-in model");
  expect_422(&c, "POST", "/v1/jobs",
             "{\"workers\":2,\"algorithm\":\"asgd\",\"program\":{\"name\":\"p1\"}}", "invalid_spec",
             "algorithm", "wagma, allreduce or local-sgd");
  expect_422(&c, "POST", "/v1/jobs",
             "{\"workers\":1,\"program\":{\"name\":\"p1\",\"args\":[\"a\",\"b\",3]}}",
             "invalid_spec", "program.args[2]", NULL);
  json_t *v = call(&c, "GET", "/v1/jobs", NULL, 200);
  assert_int_equal(json_array_size(json_object_get(v, "jobs")), 0);
  json_decref(v);

  /* A program job; arguments with shell metacharacters are stored as given. */
  v = call(&c, "POST", "/v1/jobs",
           "{\"name\":\"prog\",\"workers\":1,\"program\":{\"name\":\"p1\",\"args\":[\"--lr\","
           "\"0.05\",\"; rm -rf / $(x) 'q'\"]}}",
           201);
  json_t *prog = json_object_get(json_object_get(v, "spec"), "program");
  assert_string_equal(json_string_value(json_object_get(prog, "name")), "p1");
  assert_string_equal(json_string_value(json_array_get(json_object_get(prog, "args"), 2)),
                      "; rm -rf / $(x) 'q'");
  assert_int_equal(json_integer_value(json_object_get(prog, "max_restarts")), 3);
  assert_null(json_object_get(json_object_get(v, "spec"), "model"));
  assert_null(json_object_get(json_object_get(v, "spec"), "dataset"));
  json_decref(v);
  expect_422(&c, "PATCH", "/v1/jobs/prog", "{\"program\":{\"name\":\"p2\"}}", "invalid_patch",
             "program", "immutable");
  /* its "submitted" event names the program where a built-in job's names the model */
  const char *msg = NULL;
  double t0 = harness_now();
  while (!msg && harness_now() - t0 < 5) {
    v = call(&c, "GET", "/v1/jobs/prog/events", NULL, 200);
    json_t *first = json_array_get(json_object_get(v, "events"), 0);
    if (first && strcmp(json_string_value(json_object_get(first, "type")), "submitted") == 0) {
      snprintf(buf, sizeof buf, "%s", json_string_value(json_object_get(first, "message")));
      msg = buf;
    }
    json_decref(v);
    if (!msg)
      harness_sleep(0.05);
  }
  assert_non_null(msg);
  assert_string_equal(msg, "submitted: 1 workers (min 1, max 1), wagma program p1");

  /* An agent without the program: the job stays pending, its reason names the program. */
  put_agent(e, &a1, "a1", 7601, "cpu", NULL);
  wait_reason(&c, "prog", "no live cpu agent has program p1", 5);
  harness_sleep(1.5); /* a few passes: a1 is never given the job */
  assert_string_equal(status_str(&c, "prog", "state", buf, sizeof buf), "pending");
  assert_string_equal(agent_job(&c, "a1", buf, sizeof buf, NULL), "");

  /* An agent with it (and a cuda agent with it) registers: the job goes to a0 only. */
  put_agent(e, &g0, "g0", 7602, "cuda", "[\"p1\"]");
  harness_sleep(0.5);
  assert_string_equal(status_str(&c, "prog", "state", buf, sizeof buf), "pending");
  put_agent(e, &a0, "a0", 7600, "cpu", "[\"p1\",\"other\"]");
  assert_true(harness_wait_epoch(c.base, "prog", 1, 5) >= 0);
  v = call(&c, "GET", "/v1/jobs/prog", NULL, 200);
  json_t *members = json_object_get(v, "members");
  assert_int_equal(json_array_size(members), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(members, 0), "name")), "a0");
  assert_string_equal(json_string_value(json_object_get(json_object_get(v, "status"), "state")),
                      "running");
  json_decref(v);
  json_t *programs = NULL;
  assert_string_equal(agent_job(&c, "a0", buf, sizeof buf, &programs), "prog");
  assert_int_equal(json_array_size(programs), 2);
  assert_string_equal(json_string_value(json_array_get(programs, 0)), "other"); /* sorted */
  assert_string_equal(json_string_value(json_array_get(programs, 1)), "p1");
  json_decref(programs);
  programs = NULL;
  assert_string_equal(agent_job(&c, "a1", buf, sizeof buf, &programs), "");
  assert_int_equal(json_array_size(programs), 0);
  json_decref(programs);
  assert_string_equal(agent_job(&c, "g0", buf, sizeof buf, NULL), "");

  /* A program nobody has: pending, named, for good. */
  json_decref(call(&c, "POST", "/v1/jobs",
                   "{\"name\":\"nope\",\"workers\":1,\"program\":{\"name\":\"nope\"}}", 201));
  wait_reason(&c, "nope", "no live cpu agent has program nope", 5);
  harness_sleep(1.5);
  assert_string_equal(status_str(&c, "nope", "state", buf, sizeof buf), "pending");
  assert_string_equal(status_str(&c, "nope", "reason", buf, sizeof buf),
                      "no live cpu agent has program nope");

  /* A program that agents have, all busy: waiting for one with it. */
  json_decref(call(&c, "POST", "/v1/jobs",
                   "{\"name\":\"more\",\"workers\":1,\"program\":{\"name\":\"p1\"}}", 201));
  wait_reason(&c, "more", "waiting for 1 free cpu agents with program p1", 5);
  assert_string_equal(agent_job(&c, "a1", buf, sizeof buf, NULL), "");
  /* the device counts too: a cuda agent has p1, no cpu agent has "other"... */
  json_decref(call(&c, "POST", "/v1/jobs",
                   "{\"name\":\"gpu\",\"workers\":1,\"device\":\"cuda\",\"program\":{\"name\":"
                   "\"other\"}}",
                   201));
  wait_reason(&c, "gpu", "no live cuda agent has program other", 5);
  /* ...and a built-in job takes the agent without programs. */
  json_decref(call(&c, "POST", "/v1/jobs", "{\"name\":\"builtin\",\"workers\":1}", 201));
  assert_true(harness_wait_epoch(c.base, "builtin", 1, 5) >= 0);
  assert_string_equal(agent_job(&c, "a1", buf, sizeof buf, NULL), "builtin");

  /* The program's agent finishes "prog": "more" gets it. */
  harness_progress(e->etcd, "prog", "a0", 1000, "done", 0.1);
  assert_true(harness_wait_state(c.base, "prog", "succeeded", 5) >= 0);
  assert_true(harness_wait_epoch(c.base, "more", 1, 5) >= 0);
  assert_string_equal(agent_job(&c, "a0", buf, sizeof buf, NULL), "more");

  harness_coord_stop(&c, SIGTERM);
  harness_agent_kill(e->etcd, &a0);
  harness_agent_kill(e->etcd, &a1);
  harness_agent_kill(e->etcd, &g0);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_program_scheduling, harness_group_setup,
                                      harness_group_teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
