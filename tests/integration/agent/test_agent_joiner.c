/* test_agent_joiner.c — a joiner whose joining sync brings no model does not train from its
 * seed (agent/runner.c connect_epoch), end to end: a real etcd, a real wagma-coordinator and
 * real wagma-agent processes on 127.0.0.1.
 *
 * An allreduce job (synthetic data, workers 2, min_workers 1) runs on agent-0 alone; agent-0
 * is frozen (SIGSTOP) with a lease TTL that outlives the scenario, and agent-1 is added with a
 * 1 s --connect-timeout. The coordinator plans {agent-0 survivor, agent-1 joiner}; agent-1's
 * mesh cannot complete its handshake with the frozen agent-0, so its communicator opens with
 * agent-0 dead and its joining sync has no live member with a model (WAGMA_EINVAL: every live
 * weight is 0). agent-1 must log "brought no model", never "fresh start" nor "joined as rank"
 * (it does not train), never report "running", and be reported unavailable: the job's reason
 * names it and the coordinator replans without it, all while agent-0 is still frozen. Then
 * agent-0 is resumed (SIGCONT): once it runs the job again agent-1 is quarantined
 * (GET /v1/agents: the fault is agent-1's), and the job succeeds on agent-0 alone, which kept
 * the job's model (after epoch 1's fresh start it only joined epochs as a survivor).
 * Before the fix agent-1 took that EINVAL for a fresh start and trained on from its seed model:
 * it logged "epoch 2 joined as rank 1/2 (joiner, weight 0)", reported "running", and (no
 * sleep per step, its frozen peer dead for the epoch) reached "done at iteration 2000" on the
 * seed's model within 0.1 s; it was never reported unavailable (the job's reason stayed empty).
 * Label timing: the scenario must fit in agent-0's lease TTL (wall clock). Everything is
 * stopped by PID (cluster.c). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"

#define JOB "seedless"
#define ITERATIONS 2000
/* agent-0's lease outlives the freeze: it must not expire (between TTL - TTL/3 and TTL after
 * the freeze) before agent-1 was replanned away */
#define FROZEN_LEASE_TTL "15"
/* agent-1 is added, planned, gives up on its sync and is replanned away within this bound */
#define UNAVAILABLE_BOUND_S 8.0

static const char *const common_args[] = {"--progress-interval",
                                          "0.2",
                                          "--round-deadline",
                                          "0.3",
                                          "--synthetic-train",
                                          "2048",
                                          "--synthetic-test",
                                          "512",
                                          "--eval-samples",
                                          "256",
                                          "--data-dir",
                                          "/nonexistent/wagma-test",
                                          "--linger",
                                          "2",
                                          NULL};

/* "healthy" of agent name in GET /v1/agents (-1 when absent); reason gets the quarantine
 * reason ("" when none). */
static int agent_healthy(const cluster_t *c, const char *name, char *reason, size_t len) {
  json_t *a = cluster_agent_get(c, name);
  reason[0] = '\0';
  if (!a)
    return -1;
  int healthy = json_is_true(json_object_get(a, "healthy"));
  const char *why = json_string_value(json_object_get(json_object_get(a, "quarantine"), "reason"));
  if (why)
    snprintf(reason, len, "%s", why);
  json_decref(a);
  return healthy;
}

static void test_joiner_without_model_drops_out(void **state) {
  (void)state;
  static const char *const coordinator_args[] = {"--quarantine", "120", NULL};
  /* agent-0: a long lease; 4 ms per step so that the job lasts past the freeze */
  const char *const a_args[] = {
      "--lease-ttl", FROZEN_LEASE_TTL, "--sleep-prob", "1", "--sleep-ms", "4", NULL};
  const char *const b_args[] = {"--connect-timeout", "1", "--collective-timeout", "2", NULL};
  cluster_t c;
  job_view_t v;
  char why[256];
  if (cluster_start_with(&c, 0, common_args, coordinator_args) != 0) {
    cluster_dump_logs(&c);
    cluster_stop(&c);
    fail_msg("cluster did not start");
  }
  assert_int_equal(cluster_add_agent(&c, a_args), 0);
  assert_int_equal(cluster_wait_agents(&c, 1, 30), 0);
  assert_int_equal(cluster_job_submit(&c,
                                      "{\"name\":\"" JOB "\",\"model\":\"softmax\","
                                      "\"dataset\":\"synthetic\",\"algorithm\":\"allreduce\","
                                      "\"workers\":2,\"min_workers\":1,\"batch_size\":32,"
                                      "\"iterations\":%d,\"eval_every\":500}",
                                      ITERATIONS),
                   0);
  if (cluster_wait_training(&c, JOB, 0, 1, 20, 30, &v) < 0)
    cluster_dump_logs(&c);
  assert_int_equal(v.nmembers, 1);
  uint64_t e0 = v.epoch;

  /* agent-0 frozen, agent-1 added: planned as the joiner of a survivor out of reach */
  assert_int_equal(cluster_signal_member(&c, 0, JOB, SIGSTOP), 0);
  double t0 = cluster_now();
  int b = cluster_add_agent(&c, b_args);
  assert_int_equal(b, 1);
  int planned = 0, ran = 0, named = 0;
  while (!named && cluster_now() - t0 < UNAVAILABLE_BOUND_S) {
    if (cluster_job_get(&c, JOB, &v) == 0) {
      const job_member_t *m = job_member(&v, "agent-1");
      planned |= m != NULL;
      if (m && m->has_progress && strcmp(m->state, "running") == 0)
        ran = 1;
      named = planned && !m && strstr(v.reason, "agent-1 unavailable") &&
              strstr(v.reason, "brought no model");
    }
    if (!named)
      cluster_sleep(0.1);
  }
  fprintf(stderr, "  after %.1f s: agent-1 planned %d, running %d; epoch %llu, reason \"%s\"\n",
          cluster_now() - t0, planned, ran, (unsigned long long)v.epoch, v.reason);
  double frozen_s = cluster_now() - t0;
  cluster_signal_member(&c, 0, JOB, SIGCONT);
  if (!named || ran)
    cluster_dump_logs(&c);
  assert_true(cluster_agent_log_count(&c, b, "brought no model", NULL) > 0);
  assert_int_equal(cluster_agent_log_count(&c, b, "fresh start", NULL), 0);
  assert_int_equal(cluster_agent_log_count(&c, b, "joined as rank", NULL), 0);
  assert_true(planned);
  assert_false(ran);
  assert_true(named);
  /* agent-0's lease held through the freeze: it is still the job's member */
  assert_true(frozen_s < atof(FROZEN_LEASE_TTL) * 2 / 3);
  assert_true(v.epoch >= e0 + 2); /* {agent-0, agent-1}, then {agent-0} again */
  assert_non_null(job_member(&v, "agent-0"));

  /* Once agent-0 runs the job again, agent-1 is quarantined for it (the fault is agent-1's). */
  int quarantined = 0;
  for (double t1 = cluster_now(); !quarantined && cluster_now() - t1 < 10;) {
    quarantined = agent_healthy(&c, "agent-1", why, sizeof why) == 0;
    if (!quarantined)
      cluster_sleep(0.2);
  }
  fprintf(stderr, "  agent-1 quarantined %d: %s\n", quarantined, why);
  if (!quarantined)
    cluster_dump_logs(&c);
  assert_true(quarantined);
  assert_non_null(strstr(why, JOB));
  assert_non_null(strstr(why, "brought no model"));

  /* agent-0 resumed: the job succeeds on it alone, with the model it kept */
  int ok = cluster_job_wait_state(&c, JOB, "succeeded", 30, &v);
  if (ok != 0)
    cluster_dump_logs(&c);
  assert_int_equal(ok, 0);
  fprintf(stderr, "  succeeded %.1f s after the freeze: epoch %llu, %d member(s), loss %.3f\n",
          cluster_now() - t0, (unsigned long long)v.epoch, v.nmembers,
          v.nmembers ? v.members[0].loss : -1.0);
  assert_int_equal(v.nmembers, 1);
  assert_string_equal(v.members[0].name, "agent-0");
  assert_string_equal(v.members[0].state, "done");
  assert_true(v.members[0].iteration >= ITERATIONS);
  /* agent-0 kept its model: a fresh start in epoch 1 only, a survivor (weight 1) since */
  assert_int_equal(cluster_agent_log_count(&c, 0, "joined as rank", "(fresh start"), 1);
  assert_int_equal(cluster_agent_log_count(&c, 0, "epoch 1 joined as rank", "(fresh start"), 1);
  assert_int_equal(cluster_agent_log_count(&c, 0, "joined as rank", "(joiner"), 0);
  assert_int_equal(cluster_agent_log_count(&c, 0, "joined as rank", "without a model"), 0);
  assert_true(cluster_agent_log_count(&c, 0, "joined as rank", "(survivor, weight 1)") > 0);
  cluster_stop(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_joiner_without_model_drops_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
