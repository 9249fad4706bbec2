/* test_agent_gpu.c — wagma-agent training on the GPU (label gpu): a real etcd, a real
 * wagma-coordinator and 4 wagma-agent processes started with --device cuda, all sharing the
 * one GPU of the machine (each its own process and CUDA context, averaging over the TCP
 * transport through page-locked host mirrors, agent/model_host.c). For each algorithm a job
 * with "device": "cuda" converges: every member reports done with a training loss under
 * LOSS_BOUND and a test accuracy over ACC_BOUND, and the members' models end close to each
 * other (fingerprint spread, the bound of test_agent.c: averaging that did not reach the
 * device would leave the models 30x further apart). Then a job of one agent with --transport
 * nccl (one GPU runs single-rank NCCL only).
 *
 * Without a usable CUDA GPU (or in a build without the CUDA backend) it exits 77: skipped, with
 * the cause on stderr. scripts/gpu-check.sh runs it. Everything started is stopped by PID. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent/train/train.h"
#include "cluster.h"

#define LOSS_BOUND 0.5
#define ACC_BOUND 0.8
#define SPREAD_BOUND 0.05 /* calibrated in test_agent.c */

static const char *agent_args[] = {"--device",
                                   "cuda",
                                   "--lease-ttl",
                                   "6",
                                   "--progress-interval",
                                   "0.3",
                                   "--round-deadline",
                                   "0.5",
                                   "--synthetic-train",
                                   "4096",
                                   "--synthetic-test",
                                   "1024",
                                   "--eval-samples",
                                   "512",
                                   "--linger",
                                   "20",
                                   NULL};

/* LeNet-5 takes a smaller step than the MLP: with momentum 0.9 and batch 32, at lr 0.05 (and
 * at 0.02 with these agent and job names, which seed it) it stays at chance for 160 iterations,
 * on the CPU exactly as on the GPU, with or without averaging; at 0.01 it reaches 0.94. */
static double learning_rate(const char *model) {
  return strcmp(model, "lenet5") == 0 ? 0.01 : 0.05;
}

static void converge_n(cluster_t *c, const char *job, const char *model, const char *algorithm,
                       int workers, int iterations, double lr) {
  job_view_t v;
  assert_int_equal(
      cluster_job_submit(c,
                         "{\"name\":\"%s\",\"device\":\"cuda\",\"model\":\"%s\","
                         "\"dataset\":\"synthetic\",\"algorithm\":\"%s\",\"workers\":%d,"
                         "\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,"
                         "\"iterations\":%d,\"eval_every\":40,"
                         "\"optimizer\":{\"type\":\"sgd\",\"lr\":%g,\"momentum\":0.9}}",
                         job, model, algorithm, workers, iterations, lr),
      0);
  if (cluster_job_wait_state(c, job, "succeeded", 180, &v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "succeeded");
  assert_int_equal(v.nmembers, workers);
  for (int i = 0; i < v.nmembers; i++) {
    const job_member_t *m = &v.members[i];
    fprintf(stderr, "  %s %s: %s iteration %llu loss %.4f accuracy %.4f\n", job, m->name, m->state,
            (unsigned long long)m->iteration, m->loss, m->accuracy);
    assert_string_equal(m->state, "done");
    assert_true(m->loss >= 0 && m->loss < LOSS_BOUND);
    assert_true(m->accuracy > ACC_BOUND);
  }
  double spread = job_fingerprint_spread(&v);
  assert_true(spread >= 0);
  fprintf(stderr, "  %s: fingerprint spread %.3g (bound %.3g)\n", job, spread, SPREAD_BOUND);
  assert_true(spread <= SPREAD_BOUND);
}

static void converge(cluster_t *c, const char *model, const char *algorithm) {
  char job[64];
  snprintf(job, sizeof job, "gpu-%s-%s", model, algorithm);
  converge_n(c, job, model, algorithm, 4, 160, learning_rate(model));
}

static void test_wagma_on_gpu(void **state) {
  converge(*state, "mlp", "wagma");
}
static void test_allreduce_on_gpu(void **state) {
  converge(*state, "mlp", "allreduce");
}
static void test_local_sgd_on_gpu(void **state) {
  converge(*state, "lenet5", "local-sgd");
}

/* NCCL needs one GPU per rank: on a one-GPU machine, a job of one agent with --transport nccl
 * (agent-0 restarted with it; the scheduler takes free agents in name order). Its global sync,
 * rounds and final average go through the NCCL transport's init and self-transfers. */
static void test_nccl_job_of_one(void **state) {
  cluster_t *c = *state;
  const char *nccl[] = {"--transport", "nccl", NULL};
  assert_int_equal(cluster_restart_agent(c, 0, nccl), 0);
  assert_int_equal(cluster_wait_agents(c, 4, 30), 0);
  /* long enough for the lane to come up: NCCL's first initialisation in a process takes
   * ~0.7 s on an H100 (loading its kernels), and 160 iterations take 0.17 s; at lr 0.05 the MLP
   * diverges within 4000 iterations (on the CPU too), at 0.01 it reaches 0.99 in 3000 */
  converge_n(c, "gpu-nccl-one", "mlp", "wagma", 1, 3000, 0.01);
  /* the job ran on the NCCL lane, not on the TCP fallback of a lane that never came up */
  int up = cluster_agent_log_count(c, 0, "nccl lane up", NULL) > 0,
      off = cluster_agent_log_count(c, 0, "no nccl lane", NULL) > 0;
  if (!up || off)
    cluster_dump_logs(c);
  assert_true(up);
  assert_false(off);
}

static int setup(void **state) {
  return cluster_group_setup(state, 4, agent_args);
}

int main(void) {
  char why[256];
  if (wagma_backend_probe("cuda", why, sizeof why) != 0) {
    fprintf(stderr, "test_agent_gpu: skipped: %s\n", why);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wagma_on_gpu),
      cmocka_unit_test(test_allreduce_on_gpu),
      cmocka_unit_test(test_local_sgd_on_gpu),
      cmocka_unit_test(test_nccl_job_of_one),
  };
  return cmocka_run_group_tests(tests, setup, cluster_group_teardown);
}
