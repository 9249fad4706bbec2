/* test_agent_finish.c — a job whose members finish while their agent keys are gone is
 * completed, never planned again at its last iteration (the soak's etcd restart at a job's
 * end: the agents' leases expired during the outage, their "done" reports reached etcd after
 * the coordinator had seen them leave, and the coordinator planned the job again from the
 * seed at its last iteration, so it "succeeded" at chance accuracy).
 *
 * Real etcd and coordinator (tests/integration/agent/cluster, no agent processes); the agents
 * are registrations and progress reports written to etcd with etcdctl, so the order of events
 * that the outage produced by chance is exact here:
 *   1. agents fake-0..3 registered; a job of 2 workers runs on fake-0, fake-1 (epoch 1);
 *   2. their reports: fake-0 at the last iteration, fake-1 one round before it;
 *   3. every agent key goes (the outage outlived the leases); fake-2, fake-3 come back;
 *   4. the job must not get a new plan (it would start at the last iteration from nothing):
 *      it keeps epoch 1 and waits for the final reports;
 *   5. fake-0 and fake-1 report "done" in epoch 1: the job succeeds, still in epoch 1.
 * test_done_while_pending: the same when the job went pending before the reports came.
 * test_done_while_a_member_died: one member finished, the other died before the end: the job
 * is complete (no plan past its last iteration with a joiner beside the finished member).
 * test_final_reports_after_a_plan_at_the_end: an epoch planned at the last iteration, whose
 * members lose their keys before any report of it, waits for their final reports.
 * test_diverged_model_fails (2 real agents): a model that became NaN fails the job loudly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cluster.h"
#include "wagma/api.h"

#define ITERATIONS 100

static wagma_keys_t keys;

static void etcdctl(cluster_t *c, const char *args) {
  assert_int_equal(etcd_fixture_etcdctl(c->etcd, args), 0);
}

static void register_fake(cluster_t *c, const char *name) {
  wagma_agent_info_t a = {.device = WAGMA_DEVICE_CPU, .capacity = 1};
  char key[256], cmd[1024], *json = NULL;
  snprintf(a.address, sizeof a.address, "127.0.0.1:9"); /* never dialled: no agent process */
  assert_int_equal(wagma_key_agent(&keys, name, key, sizeof key), 0);
  assert_int_equal(wagma_agent_info_to_json(&a, &json), 0);
  snprintf(cmd, sizeof cmd, "put %s '%s'", key, json);
  free(json);
  etcdctl(c, cmd);
}

static void report(cluster_t *c, const char *job, const char *name, wagma_progress_state_t state,
                   uint64_t epoch, uint64_t iteration) {
  wagma_progress_t p;
  char key[256], cmd[2048], *json = NULL;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  wagma_progress_init(&p);
  p.state = state;
  p.epoch = epoch;
  p.iteration = iteration;
  p.accuracy = 0.9;
  p.loss = 0.3;
  p.time = (double)now.tv_sec + now.tv_nsec * 1e-9;
  snprintf(p.role, sizeof p.role, "worker");
  assert_int_equal(wagma_key_job_progress(&keys, job, name, key, sizeof key), 0);
  assert_int_equal(wagma_progress_to_json(&p, &json), 0);
  snprintf(cmd, sizeof cmd, "put %s '%s'", key, json);
  free(json);
  etcdctl(c, cmd);
}

/* Polls the job until pred holds (0) or timeout_s passes (-1). */
static int wait_job(cluster_t *c, const char *job, const char *state, uint64_t epoch,
                    double timeout_s, job_view_t *v) {
  for (double t0 = cluster_now(); cluster_now() - t0 < timeout_s; cluster_sleep(0.1))
    if (cluster_job_get(c, job, v) == 0 && strcmp(v->state, state) == 0 && v->epoch == epoch)
      return 0;
  return -1;
}

/* Registers fake-0..3, submits job (workers of them) and waits for its plan of epoch 1 on
 * fake-0 .. fake-<workers - 1> (free agents go in name order). */
static void start_job_of(cluster_t *c, const char *job, int workers, job_view_t *v) {
  char json[512], *body = NULL;
  long st = 0;
  assert_int_equal(wagma_keys_init(&keys, "/wagma"), 0);
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "fake-%d", i);
    register_fake(c, name);
  }
  snprintf(json, sizeof json,
           "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
           "\"algorithm\":\"wagma\",\"workers\":%d,\"min_workers\":2,\"group_size\":2,"
           "\"staleness_bound\":4,\"batch_size\":32,\"iterations\":%d}",
           job, workers, ITERATIONS);
  assert_int_equal(cluster_http(c, "POST", "/v1/jobs", json, &st, &body), 0);
  free(body);
  assert_int_equal(st, 201);
  if (wait_job(c, job, "running", 1, 20, v) != 0)
    cluster_dump_logs(c);
  assert_int_equal(v->nmembers, workers);
  for (int i = 0; i < workers; i++) {
    char name[16];
    snprintf(name, sizeof name, "fake-%d", i);
    assert_non_null(job_member(v, name));
  }
}

static void start_job(cluster_t *c, const char *job, job_view_t *v) {
  start_job_of(c, job, 2, v);
}

/* The job succeeds in epoch 1 within 10 s, with a reason that says `finished` (printed). */
static void expect_succeeded_in_epoch_1(cluster_t *c, const char *job, const char *finished,
                                        job_view_t *v) {
  if (wait_job(c, job, "succeeded", 1, 10, v) != 0)
    cluster_dump_logs(c);
  fprintf(stderr, "  job %s, epoch %llu: %s\n", v->state, (unsigned long long)v->epoch, v->reason);
  assert_string_equal(v->state, "succeeded");
  assert_int_equal(v->epoch, 1);
  assert_non_null(strstr(v->reason, finished));
}

/* The final reports arrive after the members were seen leaving: the job succeeds in epoch 1. */
static void final_reports(cluster_t *c, const char *job, job_view_t *v) {
  report(c, job, "fake-0", WAGMA_PROGRESS_DONE, 1, ITERATIONS);
  report(c, job, "fake-1", WAGMA_PROGRESS_DONE, 1, ITERATIONS);
  expect_succeeded_in_epoch_1(c, job, "finished", v);
}

/* One member reported the last iteration, then every agent key went: the job keeps its plan
 * (no fresh one at the last iteration) until the final reports come. */
static void test_done_while_away(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  const char *job = "finish-away";
  start_job(c, job, &v);
  report(c, job, "fake-0", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS);
  report(c, job, "fake-1", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS - 1);
  etcdctl(c, "del --prefix /wagma/agents/fake-"); /* the outage outlived every lease */
  cluster_sleep(0.5);
  register_fake(c, "fake-2"); /* the non-members register again first */
  register_fake(c, "fake-3");

  /* No new plan: one would start at the last iteration with a model trained by nobody. The
   * job keeps its plan of epoch 1 and waits for the final reports. */
  for (double t0 = cluster_now(); cluster_now() - t0 < 3.0; cluster_sleep(0.1)) {
    assert_int_equal(cluster_job_get(c, job, &v), 0);
    if (v.epoch != 1) {
      fprintf(stderr, "  replanned: %s, epoch %llu: %s\n", v.state, (unsigned long long)v.epoch,
              v.reason);
      cluster_dump_logs(c);
    }
    assert_int_equal(v.epoch, 1);
    assert_string_equal(v.state, "running");
  }
  assert_non_null(strstr(v.reason, "waiting for their final reports"));
  fprintf(stderr, "  while away: %s (%s)\n", v.state, v.reason);

  final_reports(c, job, &v);
}

/* The members left one round before the end (the job goes pending: no agent is free), then
 * their final reports come: the pending job succeeds, and agents that register afterwards do
 * not get a plan of it. */
static void test_done_while_pending(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  const char *job = "finish-pending";
  start_job(c, job, &v);
  report(c, job, "fake-0", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS - 1);
  report(c, job, "fake-1", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS - 1);
  etcdctl(c, "del --prefix /wagma/agents/fake-");
  if (wait_job(c, job, "pending", 1, 10, &v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "pending");
  final_reports(c, job, &v);
  register_fake(c, "fake-2");
  register_fake(c, "fake-3");
  cluster_sleep(1.5);
  assert_int_equal(cluster_job_get(c, job, &v), 0);
  assert_string_equal(v.state, "succeeded");
  assert_int_equal(v.epoch, 1);
}

/* One member finished (and is still registered), the other died one round before the end
 * (its key expired): the job is complete in epoch 1. Planning again would put a joiner
 * (fake-2, free) at the last iteration beside the finished member, and once that one left,
 * alone: the soak's job soak-102, which then failed with "the job's model is lost". */
static void test_done_while_a_member_died(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  const char *job = "finish-died";
  start_job(c, job, &v);
  report(c, job, "fake-0", WAGMA_PROGRESS_DONE, 1, ITERATIONS);
  report(c, job, "fake-1", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS - 1);
  etcdctl(c, "del /wagma/agents/fake-1"); /* its lease expired: SIGKILLed before the end */
  expect_succeeded_in_epoch_1(c, job, "1 of 2 members finished", &v);
  /* and it stays so: no plan of it for the free agents */
  cluster_sleep(1.5);
  assert_int_equal(cluster_job_get(c, job, &v), 0);
  assert_string_equal(v.state, "succeeded");
  assert_int_equal(v.epoch, 1);
  register_fake(c, "fake-1"); /* back for the next test */
}

/* An epoch planned at the last iteration gets no report, and its members lose their keys
 * while setting it up: the job waits for their final reports (30 s from the job's newest
 * one) instead of failing at once, and succeeds when they come. The soak's soak-72: its 4
 * members finished during an etcd restart, their "done" reports not yet written; one left,
 * so epoch 2 was planned at iteration 4000 with a joiner; the others' registrations expired
 * before they were written, and the job failed in the same second (no report of epoch 2
 * counted as a report 56 years old). */
static void test_final_reports_after_a_plan_at_the_end(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  const char *job = "finish-late-plan";
  start_job_of(c, job, 3, &v);
  report(c, job, "fake-0", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS); /* done, not yet "done" */
  report(c, job, "fake-1", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS - 1);
  report(c, job, "fake-2", WAGMA_PROGRESS_RUNNING, 1, ITERATIONS - 1);
  etcdctl(c, "del /wagma/agents/fake-2"); /* it left: epoch 2 with fake-3 joining */
  if (wait_job(c, job, "running", 2, 10, &v) != 0)
    cluster_dump_logs(c);
  assert_int_equal(v.epoch, 2);
  assert_non_null(job_member(&v, "fake-3"));
  etcdctl(c, "del --prefix /wagma/agents/fake-"); /* every member's key, before any report */
  for (double t0 = cluster_now(); cluster_now() - t0 < 3.0; cluster_sleep(0.1)) {
    assert_int_equal(cluster_job_get(c, job, &v), 0);
    if (strcmp(v.state, "running") != 0)
      fprintf(stderr, "  after the keys went: %s, epoch %llu: %s\n", v.state,
              (unsigned long long)v.epoch, v.reason);
    assert_string_equal(v.state, "running");
    assert_int_equal(v.epoch, 2);
  }
  assert_non_null(strstr(v.reason, "waiting for their final reports"));
  fprintf(stderr, "  while away: %s (%s)\n", v.state, v.reason);
  /* they register again and their final reports come. A live member finishes only by
   * reporting "done" (its final report carries the result): fake-0, back at the last iteration
   * without it, holds the job (no plan meanwhile), but fake-1, back before its report at
   * iteration 99, may make one more epoch at the last iteration; either way the job succeeds
   * with their final reports */
  register_fake(c, "fake-0");
  register_fake(c, "fake-1");
  report(c, job, "fake-0", WAGMA_PROGRESS_DONE, 1, ITERATIONS);
  report(c, job, "fake-1", WAGMA_PROGRESS_DONE, 1, ITERATIONS);
  if (wait_job(c, job, "succeeded", 2, 10, &v) != 0)
    cluster_dump_logs(c);
  fprintf(stderr, "  job %s, epoch %llu: %s\n", v.state, (unsigned long long)v.epoch, v.reason);
  assert_string_equal(v.state, "succeeded");
  assert_non_null(strstr(v.reason, "members finished at iteration 100"));
  register_fake(c, "fake-2"); /* back for the next test */
  register_fake(c, "fake-3");
}

/* A model that diverged to NaN or Inf is not reported as the job's result: 2 real agents train
 * an MLP at the largest learning rate with momentum 0.99 (diverges within a few iterations);
 * the members report "failed" with the reason and the job fails, instead of "succeeded". */
static void test_diverged_model_fails(void **state) {
  cluster_t *c = *state;
  static const char *const extra[] = {"--progress-interval",
                                      "0.2",
                                      "--synthetic-train",
                                      "1024",
                                      "--synthetic-test",
                                      "256",
                                      "--data-dir",
                                      "/nonexistent/wagma-test",
                                      NULL};
  job_view_t v;
  char *body = NULL;
  long st = 0;
  etcdctl(c, "del --prefix /wagma/agents/fake-"); /* the other tests' registrations */
  for (int i = 0; i < 2; i++)
    assert_true(cluster_add_agent(c, extra) >= 0);
  assert_int_equal(cluster_wait_agents(c, 2, 30), 0);
  assert_int_equal(
      cluster_http(c, "POST", "/v1/jobs",
                   "{\"name\":\"diverge\",\"model\":\"mlp\",\"dataset\":\"synthetic\","
                   "\"algorithm\":\"allreduce\",\"workers\":2,\"min_workers\":2,"
                   "\"batch_size\":32,\"iterations\":200,\"optimizer\":{\"type\":\"sgd\","
                   "\"lr\":10,\"momentum\":0.99}}",
                   &st, &body),
      0);
  if (st != 201)
    fprintf(stderr, "  POST: %ld %s\n", st, body ? body : "");
  free(body);
  assert_int_equal(st, 201);
  for (double t0 = cluster_now(); cluster_now() - t0 < 60; cluster_sleep(0.2))
    if (cluster_job_get(c, "diverge", &v) == 0 &&
        (!strcmp(v.state, "succeeded") || !strcmp(v.state, "failed")))
      break;
  fprintf(stderr, "  diverged job: %s (%s)\n", v.state, v.reason);
  if (strcmp(v.state, "failed") != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "failed");
  assert_non_null(strstr(v.reason, "not finite"));
}

static int setup(void **state) {
  return cluster_group_setup(state, 0, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_done_while_away),
      cmocka_unit_test(test_done_while_pending),
      cmocka_unit_test(test_done_while_a_member_died),
      cmocka_unit_test(test_final_reports_after_a_plan_at_the_end),
      cmocka_unit_test(test_diverged_model_fails),
  };
  return cmocka_run_group_tests(tests, setup, cluster_group_teardown);
}
