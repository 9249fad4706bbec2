/* test_agent_straggler.c — a frozen agent (SIGSTOP) under wagma and under allreduce, with real
 * processes (etcd, wagma-coordinator, 4 wagma-agents on 127.0.0.1, synthetic data).
 *
 *  - wagma (wait-avoiding global rounds): while one agent is stopped the other three keep
 *    iterating (its groups are left out after the round deadline), no replan happens (the stop
 *    is shorter than the lease TTL), and after SIGCONT the stopped agent trains again;
 *  - allreduce: while one agent is stopped the others wait (they advance by at most a step in
 *    flight), and after SIGCONT all of them go on.
 * Label "timing": the assertions compare progress over wall-clock windows. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster.h"

#define STOP_S 3.0

static const char *const agent_args[] = {"--lease-ttl",
                                         "8",
                                         "--progress-interval",
                                         "0.2",
                                         "--round-deadline",
                                         "0.2",
                                         "--synthetic-train",
                                         "4096",
                                         "--synthetic-test",
                                         "1024",
                                         "--eval-samples",
                                         "256",
                                         "--collective-timeout",
                                         "30",
                                         "--linger",
                                         "10",
                                         NULL};

static int setup(void **state) {
  return cluster_group_setup(state, 4, agent_args);
}

static int teardown(void **state) {
  return cluster_group_teardown(state);
}

static void http_ok(cluster_t *c, const char *method, const char *path, const char *json) {
  char *body = NULL;
  long st = 0;
  assert_int_equal(cluster_http(c, method, path, json, &st, &body), 0);
  if (st / 100 != 2)
    fprintf(stderr, "%s %s -> %ld %s\n", method, path, st, body ? body : "");
  free(body);
  assert_true(st / 100 == 2);
}

/* Iterations of each member, by member index of v. */
static void iterations(const job_view_t *v, uint64_t *out) {
  for (int i = 0; i < v->nmembers; i++)
    out[i] = v->members[i].iteration;
}

static void freeze_one(cluster_t *c, const char *algorithm, const char *sync, int others_move) {
  char job[64], path[96], spec[512];
  job_view_t v;
  uint64_t a[CLUSTER_MAX_AGENTS], b[CLUSTER_MAX_AGENTS], d[CLUSTER_MAX_AGENTS];
  snprintf(job, sizeof job, "freeze-%s", algorithm);
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  snprintf(spec, sizeof spec,
           "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
           "\"algorithm\":\"%s\",\"global_sync\":\"%s\",\"workers\":4,\"group_size\":2,"
           "\"staleness_bound\":4,\"batch_size\":32,\"iterations\":100000000,"
           "\"eval_every\":500}",
           job, algorithm, sync);
  http_ok(c, "POST", "/v1/jobs", spec);
  assert_int_equal(cluster_job_wait_state(c, job, "running", 60, &v), 0);
  double deadline = cluster_now() + 60;
  while (cluster_now() < deadline &&
         (cluster_job_get(c, job, &v) != 0 || v.nmembers != 4 || job_min_iteration(&v) < 30))
    cluster_sleep(0.2);
  assert_int_equal(v.nmembers, 4);
  assert_true(job_min_iteration(&v) >= 30);
  uint64_t epoch = v.epoch;
  const char *frozen_name = v.members[1].name;
  int fi = cluster_agent_index(c, frozen_name);
  assert_true(fi >= 0);

  assert_int_equal(cluster_signal_member(c, fi, job, SIGSTOP), 0);
  cluster_sleep(0.8); /* steps in flight finish, progress catches up */
  assert_int_equal(cluster_job_get(c, job, &v), 0);
  iterations(&v, a);
  cluster_sleep(STOP_S - 0.8);
  assert_int_equal(cluster_job_get(c, job, &v), 0);
  iterations(&v, b);
  assert_int_equal(cluster_signal_member(c, fi, job, SIGCONT), 0);
  assert_int_equal(v.epoch, epoch); /* no membership change */
  for (int i = 0; i < v.nmembers; i++) {
    fprintf(stderr, "  %s %s: %llu -> %llu while %s was stopped\n", job, v.members[i].name,
            (unsigned long long)a[i], (unsigned long long)b[i], frozen_name);
    if (i == 1)
      continue;
    if (others_move)
      assert_true(b[i] >= a[i] + 10);
    else
      assert_true(b[i] <= a[i] + 2);
  }

  /* After SIGCONT everybody trains again, the frozen one included. */
  deadline = cluster_now() + 30;
  int all = 0;
  while (cluster_now() < deadline && !all) {
    cluster_sleep(0.5);
    assert_int_equal(cluster_job_get(c, job, &v), 0);
    iterations(&v, d);
    all = v.nmembers == 4;
    for (int i = 0; i < v.nmembers && all; i++)
      all = d[i] >= b[i] + 10;
  }
  for (int i = 0; i < v.nmembers; i++)
    fprintf(stderr, "  %s %s: %llu after SIGCONT\n", job, v.members[i].name,
            (unsigned long long)d[i]);
  if (!all)
    cluster_dump_logs(c);
  assert_true(all);
  http_ok(c, "DELETE", path, NULL);
  assert_int_equal(cluster_job_wait_state(c, job, "stopped", 30, &v), 0);
}

static void test_wagma_goes_on_around_a_frozen_agent(void **state) {
  freeze_one(*state, "wagma", "wait-avoiding", 1);
}

static void test_allreduce_waits_for_a_frozen_agent(void **state) {
  freeze_one(*state, "allreduce", "barrier", 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wagma_goes_on_around_a_frozen_agent),
      cmocka_unit_test(test_allreduce_waits_for_a_frozen_agent),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
