/* test_agent_nccl.c — agents that average over the NCCL transport keep a job going through
 * its members' churn, on a machine without a GPU: real etcd, coordinator and 4
 * wagma-agent-fakenccl processes on 127.0.0.1 (the agent built against tests/fake_nccl,
 * fakenccl_agent.c: CPU training, the NCCL transport's whole path with the fake's ranks as
 * processes). A wagma job of 4 workers (min 2) on synthetic data:
 *   - epoch 1: every member's lane comes up and carries the models (the transport's closing
 *     line counts the transfers of the epoch);
 *   - a member is SIGKILLed: the survivors' next epoch shrinks the communicator they kept
 *     (members only left), the lane comes up again and they train on, none restarted;
 *   - the agent comes back: its epoch initialises a fresh communicator (someone joined) and
 *     the lane comes up on all four.
 * Twice: the member SIGKILLed and started again, and SIGSTOPped (frozen; a transfer of its
 * may be left in flight, and then the survivors' communicator is revoked before it is
 * shrunk) and woken, when it finds its lease lost, registers again and rejoins.
 * No member may log "no nccl lane" (an epoch on TCP payloads) at any point. And finite jobs of
 * four to their end: wagma (rounds and the final average) and the allreduce baseline (the
 * gradient mean, a blocking collective, every step), both averaged through the lane. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"

/* a lease of 4 s: the test also runs under sanitizers, where a 2 s one can be lost to a slow
 * keepalive, and an extra epoch superseded while its lane starts logs "no nccl lane" */
static const char *const agent_args[] = {"--transport",
                                         "nccl",
                                         "--gpu", /* the test build allows it on a CPU */
                                         "0",
                                         "--lease-ttl",
                                         "4",
                                         "--progress-interval",
                                         "0.2",
                                         "--round-deadline",
                                         "0.3",
                                         "--connect-timeout",
                                         "20",
                                         "--synthetic-train",
                                         "2048",
                                         "--synthetic-test",
                                         "512",
                                         "--eval-samples",
                                         "256",
                                         "--data-dir",
                                         "/nonexistent/wagma-test",
                                         NULL};

/* Lines of agent i's log that name epoch e in the format fmt ("... epoch %llu ..."). */
static int epoch_lines(const cluster_t *c, int i, const char *fmt, uint64_t e) {
  char needle[128];
  snprintf(needle, sizeof needle, fmt, (unsigned long long)e);
  return cluster_agent_log_count(c, i, needle, NULL);
}

/* Every member of v (by its agent) logged its lane up in v's epoch, with n ranks. */
static void assert_lanes_up(const cluster_t *c, const job_view_t *v, int n) {
  char fmt[64];
  snprintf(fmt, sizeof fmt, "nccl lane up in epoch %%llu (%d ranks)", n);
  for (int k = 0; k < v->nmembers; k++) {
    int i = cluster_agent_index(c, v->members[k].name);
    assert_true(i >= 0);
    if (epoch_lines(c, i, fmt, v->epoch) < 1) {
      fprintf(stderr, "%s: no lane up in epoch %llu\n", v->members[k].name,
              (unsigned long long)v->epoch);
      cluster_dump_logs(c);
      fail();
    }
  }
}

/* Agent i closed epoch e's transport after the lane carried transfers. The line comes when
 * the agent drops the epoch's communicator (a new plan, a release): waited for up to 20 s. */
static void assert_lane_carried(const cluster_t *c, int i, uint64_t e) {
  int closed = 0;
  for (double until = cluster_now() + 20;
       (closed = epoch_lines(c, i, "epoch %llu closed: ", e)) < 1 && cluster_now() < until;)
    cluster_sleep(0.1);
  int empty = epoch_lines(c, i, "epoch %llu closed: 0 transfers", e);
  if (closed < 1 || empty > 0) {
    fprintf(stderr, "agent-%d: epoch %llu closed %d times, %d of them with no transfer\n", i,
            (unsigned long long)e, closed, empty);
    cluster_dump_logs(c);
    fail();
  }
}

/* The job trains in an epoch after `after` with n members, each 30 iterations on. */
static void train_on(cluster_t *c, const char *job, uint64_t after, int n, job_view_t *v) {
  if (cluster_wait_training(c, job, after, n, 30, 60, v) < 0) {
    cluster_dump_logs(c);
    fail();
  }
}

/* A job of four through the loss of a member (SIGKILL, or SIGSTOP: frozen, its transfers
 * stuck) and its return (a new process, or the same one woken by SIGCONT). */
static void churn(const char *job, int sig) {
  cluster_t c;
  assert_int_equal(cluster_start(&c, 4, agent_args), 0);
  pid_t pids[4];
  memcpy(pids, c.agent, sizeof pids);
  assert_int_equal(
      cluster_job_submit(&c,
                         "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
                         "\"algorithm\":\"wagma\",\"workers\":4,\"min_workers\":2,"
                         "\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,"
                         "\"iterations\":100000000,\"eval_every\":1000}",
                         job),
      0);

  /* epoch 1: four members, the lane up on each */
  job_view_t v;
  train_on(&c, job, 0, 4, &v);
  assert_lanes_up(&c, &v, 4);
  uint64_t e1 = v.epoch;

  /* a member lost: the survivors shrink the communicator they kept and train on */
  int gone = cluster_agent_index(&c, v.members[3].name);
  assert_true(gone >= 0);
  /* the whole member: its agent, and its wagma-train under --trainer program */
  assert_int_equal(cluster_signal_member(&c, gone, job, sig), 0);
  if (sig == SIGKILL) {
    waitpid(c.agent[gone], NULL, 0);
    c.agent[gone] = 0;
  }
  train_on(&c, job, e1, 3, &v);
  assert_lanes_up(&c, &v, 3);
  uint64_t e2 = v.epoch;
  for (int k = 0; k < v.nmembers; k++) {
    int i = cluster_agent_index(&c, v.members[k].name);
    assert_true(i >= 0 && i != gone);
    int shrunk = 0; /* by the first epoch after e1 without the lost member (e2, or one before) */
    for (uint64_t e = e1 + 1; e <= e2; e++)
      shrunk += epoch_lines(&c, i, "epoch %llu shrinks the communicator of epoch", e);
    assert_true(shrunk > 0);
    assert_lane_carried(&c, i, e1);
  }

  /* it comes back: a fresh communicator of four */
  if (sig == SIGKILL)
    assert_int_equal(cluster_restart_agent(&c, gone, NULL), 0);
  else
    assert_int_equal(cluster_signal_member(&c, gone, job, SIGCONT), 0);
  train_on(&c, job, e2, 4, &v);
  assert_lanes_up(&c, &v, 4);
  for (int k = 0; k < v.nmembers; k++) {
    int i = cluster_agent_index(&c, v.members[k].name);
    if (i != gone)
      assert_lane_carried(&c, i, e2);
  }

  /* never an epoch without the lane; no agent restarted but the one killed */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(cluster_agent_log_count(&c, i, "no nccl lane", NULL), 0);
    if (i != gone || sig != SIGKILL) {
      assert_int_equal(c.agent[i], pids[i]);
      assert_int_equal(waitpid(pids[i], NULL, WNOHANG), 0);
    }
  }
  assert_int_equal(cluster_job_stop(&c, job, 30), 0);
  cluster_stop(&c);
}

static void test_nccl_lane_through_kill_and_join(void **state) {
  (void)state;
  churn("ncclkill", SIGKILL);
}

static void test_nccl_lane_through_freeze_and_wake(void **state) {
  (void)state;
  churn("ncclfreeze", SIGSTOP);
}

/* A finite job of four to its end, averaged through the lane: the wagma rounds and final
 * average, or the allreduce baseline's gradient mean (a blocking collective) every step. The
 * job succeeds, every member learned, their final models agree, and the lane carried each
 * member's epoch. */
static void finite_job(const char *job, const char *algorithm) {
  cluster_t c;
  job_view_t v;
  assert_int_equal(cluster_start(&c, 4, agent_args), 0);
  assert_int_equal(
      cluster_job_submit(&c,
                         "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
                         "\"algorithm\":\"%s\",\"workers\":4,\"group_size\":2,"
                         "\"staleness_bound\":4,\"batch_size\":32,\"iterations\":160,"
                         "\"eval_every\":40,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05,"
                         "\"momentum\":0.9}}",
                         job, algorithm),
      0);
  if (cluster_job_wait_state(&c, job, "succeeded", 120, &v) != 0)
    cluster_dump_logs(&c);
  assert_string_equal(v.state, "succeeded");
  assert_int_equal(v.nmembers, 4);
  double spread = job_fingerprint_spread(&v);
  fprintf(stderr, "  %s: fingerprint spread %.3g\n", job, spread);
  assert_true(spread >= 0 && spread <= 0.05);
  for (int k = 0; k < v.nmembers; k++) {
    const job_member_t *m = &v.members[k];
    fprintf(stderr, "  %s %s: %s iteration %llu loss %.4f accuracy %.4f\n", job, m->name, m->state,
            (unsigned long long)m->iteration, m->loss, m->accuracy);
    assert_string_equal(m->state, "done");
    assert_true(m->accuracy > 0.8);
    int i = cluster_agent_index(&c, m->name);
    assert_true(i >= 0);
    assert_lane_carried(&c, i, v.epoch);
    assert_int_equal(cluster_agent_log_count(&c, i, "no nccl lane", NULL), 0);
    /* --gpu 0: the agent and its program see GPU 0 as their device */
    assert_true(
        cluster_agent_log_count(&c, i, "GPU 0: CUDA_VISIBLE_DEVICES=0 for this agent", NULL) > 0);
    assert_true(cluster_agent_log_count(&c, i, "wagma-train INFO job", "CUDA_VISIBLE_DEVICES=0") >
                0);
  }
  cluster_stop(&c);
}

static void test_nccl_wagma_job_to_its_end(void **state) {
  (void)state;
  finite_job("ncclwagma", "wagma");
}

static void test_nccl_allreduce_job_to_its_end(void **state) {
  (void)state;
  finite_job("ncclallreduce", "allreduce");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nccl_lane_through_kill_and_join),
      cmocka_unit_test(test_nccl_lane_through_freeze_and_wake),
      cmocka_unit_test(test_nccl_wagma_job_to_its_end),
      cmocka_unit_test(test_nccl_allreduce_job_to_its_end),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
