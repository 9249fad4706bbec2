/* test_algorithms.c — the seeds' baselines end to end: a real etcd, a real wagma-coordinator
 * and 4 real wagma-agent processes on 127.0.0.1, synthetic data, jobs through the REST API.
 *
 *  - adpsgd converges (every member done, loss and accuracy within bounds) and its members'
 *    models end far closer together than the same steps with averaging disabled (local-sgd
 *    with a staleness bound past the job's end: no average until the final one); REST shows
 *    each member's role (even ranks "active", odd ranks "passive") and the actives' averagings
 *    and the passives' answers in its counters;
 *  - adpsgd with one passive agent SIGSTOPped: the other members keep training in the same
 *    epoch (before the lease TTL makes a new plan) at a good fraction of their speed before
 *    the stop: nobody waits for the stopped agent beyond one deadline;
 *  - asgd (2 shards, 2 workers) and dc-asgd (plain and adaptive) converge, their workers' training
 * loss is below the same steps without averaging, REST shows "server" for the first ps_shards ranks
 * and "worker" for the others, and the shards report the pushes' delay as staleness;
 *  - asgd with its only shard SIGKILLed mid-job: a new epoch (3 members) reassigns the shard,
 *    its slice comes back from the members' copies (the workers' latest pulls), and the job
 *    succeeds with an accuracy within bounds;
 *  - gradient_delay: the spec's delay reaches the agents (a job whose delay leaves few
 *    updates ends with a clearly higher loss than the same job without), and a delayed job
 *    converges.
 * Everything started is stopped by PID (cluster.c). */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "cluster.h"

#define LOSS_BOUND 0.5
#define ACC_BOUND 0.8

static const char *agent_args[] = {"--lease-ttl",
                                   "5",
                                   "--progress-interval",
                                   "0.2",
                                   "--round-deadline",
                                   "0.3",
                                   "--synthetic-train",
                                   "4096",
                                   "--synthetic-test",
                                   "1024",
                                   "--eval-samples",
                                   "512",
                                   "--linger",
                                   "20",
                                   "--data-dir",
                                   "/nonexistent/wagma-test",
                                   NULL};

static int setup(void **state) {
  return cluster_group_setup(state, 4, agent_args);
}

static int teardown(void **state) {
  return cluster_group_teardown(state);
}

#define submit(c, ...) assert_int_equal(cluster_job_submit(c, __VA_ARGS__), 0)

#define delete_job(c, job) assert_int_equal(cluster_job_stop(c, job, 30), 0)

/* Runs a 4-worker softmax job on synthetic data to success; returns the fingerprint spread
 * and the members' mean training loss. */
static void run_job(cluster_t *c, const char *job, const char *algorithm, const char *extra,
                    int iterations, double *spread, double *mean_loss, job_view_t *v) {
  submit(c,
         "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\",\"algorithm\":\"%s\","
         "\"workers\":4,\"batch_size\":16,\"iterations\":%d,\"eval_every\":50,"
         "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05,\"momentum\":0.9}%s}",
         job, algorithm, iterations, extra);
  if (cluster_job_wait_state(c, job, "succeeded", 120, v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v->state, "succeeded");
  assert_int_equal(v->nmembers, 4);
  double sum = 0;
  for (int i = 0; i < v->nmembers; i++) {
    const job_member_t *m = &v->members[i];
    fprintf(stderr, "  %s %s: %s iteration %llu loss %.4f accuracy %.4f asked %llu answered %llu\n",
            job, m->name, m->state, (unsigned long long)m->iteration, m->loss, m->accuracy,
            (unsigned long long)m->rounds_activated, (unsigned long long)m->rounds_joined);
    assert_string_equal(m->state, "done");
    sum += m->loss;
  }
  *mean_loss = sum / v->nmembers;
  *spread = job_fingerprint_spread(v);
  assert_true(*spread >= 0);
  fprintf(stderr, "  %s: fingerprint spread %.4g, mean training loss %.4f\n", job, *spread,
          *mean_loss);
}

/* The members of GET /v1/jobs/{id} as JSON (members[i].progress.role ...). */
static json_t *job_members_json(cluster_t *c, const char *job) {
  char path[128], *body = NULL;
  long st = 0;
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  assert_int_equal(cluster_http(c, "GET", path, NULL, &st, &body), 0);
  assert_int_equal(st, 200);
  json_t *root = json_loads(body, 0, NULL);
  free(body);
  assert_non_null(root);
  json_t *members = json_incref(json_object_get(root, "members"));
  json_decref(root);
  assert_true(json_is_array(members));
  return members;
}

static void test_adpsgd_converges_with_models_closer_than_without_averaging(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  double spread_ad, loss_ad, spread_none, loss_none;
  run_job(c, "ad-conv", "adpsgd", "", 300, &spread_ad, &loss_ad, &v);
  for (int i = 0; i < v.nmembers; i++) {
    assert_true(v.members[i].loss >= 0 && v.members[i].loss < LOSS_BOUND);
    assert_true(v.members[i].accuracy > ACC_BOUND);
    /* even ranks asked, odd ranks answered */
    if (i % 2 == 0)
      assert_true(v.members[i].rounds_activated > 0);
    else
      assert_true(v.members[i].rounds_joined > 0);
  }
  json_t *members = job_members_json(c, "ad-conv");
  assert_int_equal(json_array_size(members), 4);
  for (size_t i = 0; i < json_array_size(members); i++) {
    json_t *m = json_array_get(members, i);
    int rank = (int)json_integer_value(json_object_get(m, "rank"));
    const char *role = json_string_value(json_object_get(json_object_get(m, "progress"), "role"));
    fprintf(stderr, "  ad-conv rank %d: role %s\n", rank, role ? role : "(none)");
    assert_non_null(role);
    assert_string_equal(role, rank % 2 == 0 ? "active" : "passive");
  }
  json_decref(members);
  /* the same steps with averaging disabled: no average before the final one */
  run_job(c, "ad-none", "local-sgd", ",\"staleness_bound\":1000000", 300, &spread_none, &loss_none,
          &v);
  fprintf(stderr,
          "  adpsgd spread %.4g vs %.4g, mean training loss %.4f vs %.4f without averaging\n",
          spread_ad, spread_none, loss_ad, loss_none);
  /* measured: spread 0.03-0.29 vs 1.38; the loss (0.0020-0.0028 vs 0.0113, both converged) is
   * printed, not asserted: a converged training loss is noise on a loaded machine */
  assert_true(spread_ad < 0.5 * spread_none);
}

/* The members' iterations (by rank) once every member reported progress in epoch >= 1. */
static int read_iterations(cluster_t *c, const char *job, job_view_t *v, uint64_t *it) {
  if (cluster_job_get(c, job, v) != 0 || v->nmembers != 4)
    return -1;
  for (int i = 0; i < 4; i++) {
    if (!v->members[i].has_progress)
      return -1;
    it[i] = v->members[i].iteration;
  }
  return 0;
}

static void test_adpsgd_stopped_agent_others_keep_training(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  uint64_t a[4], b[4], d[4];
  submit(c, "{\"name\":\"ad-stop\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"adpsgd\",\"workers\":4,\"batch_size\":16,\"iterations\":100000000,"
            "\"eval_every\":0}");
  double t0 = cluster_now();
  while (read_iterations(c, "ad-stop", &v, a) != 0 || a[0] < 50 || a[1] < 50 || a[2] < 50 ||
         a[3] < 50) {
    if (cluster_now() - t0 > 60) {
      cluster_dump_logs(c);
      fail_msg("ad-stop did not start training");
    }
    cluster_sleep(0.1);
  }
  /* the pace before the stop, over one window */
  const double window = 1.0;
  uint64_t s[4];
  assert_int_equal(read_iterations(c, "ad-stop", &v, a), 0);
  cluster_sleep(window);
  assert_int_equal(read_iterations(c, "ad-stop", &v, b), 0);
  uint64_t epoch = v.epoch;
  /* stop rank 1 (a passive: the actives ask it about every other step) */
  int k = cluster_agent_index(c, v.members[1].name);
  assert_true(k >= 0);
  assert_int_equal(kill(c->agent[k], SIGSTOP), 0);
  cluster_sleep(0.5); /* its last progress report lands */
  assert_int_equal(read_iterations(c, "ad-stop", &v, s), 0);
  cluster_sleep(window);
  int ok = read_iterations(c, "ad-stop", &v, d);
  uint64_t epoch_after = v.epoch;
  kill(c->agent[k], SIGCONT);
  assert_int_equal(ok, 0);
  fprintf(stderr,
          "  ad-stop: epoch %llu -> %llu; iterations per %.0f s before / while rank 1 "
          "was stopped:",
          (unsigned long long)epoch, (unsigned long long)epoch_after, window);
  for (int r = 0; r < 4; r++)
    fprintf(stderr, " rank %d %llu / %llu", r, (unsigned long long)(b[r] - a[r]),
            (unsigned long long)(d[r] - s[r]));
  fprintf(stderr, "\n");
  assert_true(epoch_after == epoch); /* measured before the lease ran out: the same plan */
  assert_true(d[1] - s[1] <= 1);     /* the stopped agent did stop */
  /* the others kept training: at least 100 iterations and a tenth of their pace before the
   * stop (measured: thousands per second either way, on 2 shared cores; an active that waited
   * out the 0.3 s deadline at each ask of rank 1 would make about 6) */
  for (int r = 0; r < 4; r++)
    if (r != 1)
      assert_true(d[r] - s[r] >= 100 && 10 * (d[r] - s[r]) >= b[r] - a[r]);
  delete_job(c, "ad-stop");
}

static void test_gradient_delay_reaches_the_agents(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  double spread, loss_plain, loss_delayed, loss_conv;
  /* 80 iterations with a delay of 70: only 10 updates, each with a gradient 70 steps old */
  run_job(c, "delay-0", "local-sgd", ",\"staleness_bound\":10", 80, &spread, &loss_plain, &v);
  run_job(c, "delay-70", "local-sgd", ",\"staleness_bound\":10,\"gradient_delay\":70", 80, &spread,
          &loss_delayed, &v);
  fprintf(stderr, "  80 iterations: loss %.4f without delay, %.4f with a delay of 70\n", loss_plain,
          loss_delayed);
  assert_true(loss_delayed > 2 * loss_plain);
  /* a moderate delay still converges */
  run_job(c, "delay-4", "adpsgd", ",\"gradient_delay\":4", 300, &spread, &loss_conv, &v);
  for (int i = 0; i < v.nmembers; i++) {
    assert_true(v.members[i].loss >= 0 && v.members[i].loss < LOSS_BOUND);
    assert_true(v.members[i].accuracy > ACC_BOUND);
  }
}

static void check_roles(cluster_t *c, const char *job, int shards) {
  json_t *members = job_members_json(c, job);
  for (size_t i = 0; i < json_array_size(members); i++) {
    json_t *m = json_array_get(members, i);
    int rank = (int)json_integer_value(json_object_get(m, "rank"));
    json_t *progress = json_object_get(m, "progress");
    const char *role = json_string_value(json_object_get(progress, "role"));
    fprintf(stderr, "  %s rank %d: role %s, staleness %lld\n", job, rank, role ? role : "(none)",
            (long long)json_integer_value(json_object_get(progress, "staleness")));
    assert_non_null(role);
    assert_string_equal(role, rank < shards ? "server" : "worker");
  }
  json_decref(members);
}

/* Every push reached its shard: each worker's shards applied its pushes of every step, and
 * each shard applied exactly the workers' pushes (rounds_activated / rounds_joined in REST). */
static void check_pushes(const char *job, const job_view_t *v, int shards, int iterations) {
  uint64_t sent = 0;
  for (int i = 0; i < v->nmembers; i++)
    if (i >= shards) {
      fprintf(stderr, "  %s rank %d: %llu pushes applied by its shards\n", job, i,
              (unsigned long long)v->members[i].rounds_activated);
      assert_int_equal(v->members[i].rounds_activated, (uint64_t)iterations);
      sent += v->members[i].rounds_activated;
    }
  for (int i = 0; i < shards; i++) {
    fprintf(stderr, "  %s rank %d: applied %llu of the workers' %llu pushes\n", job, i,
            (unsigned long long)v->members[i].rounds_joined, (unsigned long long)sent);
    assert_int_equal(v->members[i].rounds_joined, sent);
  }
}

static void test_asgd_and_dc_asgd_train_one_model_from_every_push(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  double spread, loss_none, loss[3];
  const char *algos[3] = {"asgd", "dc-asgd", "dc-asgd"};
  const char *extra[3] = {"", "", ",\"dc_adaptive\":true"};
  run_job(c, "ps-none", "local-sgd", ",\"staleness_bound\":1000000", 300, &spread, &loss_none, &v);
  for (int a = 0; a < 3; a++) {
    char job[32], more[96];
    snprintf(job, sizeof job, "ps-%s%s", algos[a], extra[a][0] ? "-a" : "");
    snprintf(more, sizeof more, ",\"ps_shards\":2,\"dc_lambda\":0.5%s", extra[a]);
    run_job(c, job, algos[a], more, 300, &spread, &loss[a], &v);
    for (int i = 0; i < v.nmembers; i++) {
      assert_true(v.members[i].accuracy > ACC_BOUND); /* everyone evaluates the shards' model */
      assert_true(v.members[i].loss >= 0 && v.members[i].loss < LOSS_BOUND);
    }
    check_roles(c, job, 2);
    check_pushes(job, &v, 2, 300);
    /* the members' mean training loss beside the same steps on 4 separate models: measured,
     * not asserted (both converged by then: 0.0016-0.0072 with a shared model against 0.0113,
     * and once 0.0143 on a loaded CI machine) */
    fprintf(stderr, "  %s: mean training loss %.4f vs %.4f without averaging\n", job, loss[a],
            loss_none);
  }
}

static void test_asgd_shard_killed_new_epoch_job_finishes(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  /* an MLP (235k parameters: about 1 MB pulled and pushed per step) so that the job is still
   * training when the lease of the killed shard runs out */
  submit(c, "{\"name\":\"ps-kill\",\"model\":\"mlp\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"asgd\",\"workers\":4,\"min_workers\":2,\"ps_shards\":1,"
            "\"batch_size\":16,\"iterations\":4000,\"eval_every\":1000,"
            "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05,\"momentum\":0}}");
  double t0 = cluster_now();
  uint64_t it[4];
  while (read_iterations(c, "ps-kill", &v, it) != 0 || it[3] < 100) {
    if (cluster_now() - t0 > 60) {
      cluster_dump_logs(c);
      fail_msg("ps-kill did not start training");
    }
    cluster_sleep(0.1);
  }
  uint64_t epoch = v.epoch;
  check_roles(c, "ps-kill", 1);
  int k = cluster_agent_index(c, v.members[0].name); /* rank 0: the shard */
  assert_true(k >= 0);
  fprintf(stderr, "  ps-kill: SIGKILL the shard %s at worker iteration %llu\n", c->agent_name[k],
          (unsigned long long)it[3]);
  assert_int_equal(kill(c->agent[k], SIGKILL), 0);
  waitpid(c->agent[k], NULL, 0);
  c->agent[k] = 0;
  /* the new epoch comes while the job still has work: the new shard serves the rest */
  while (cluster_job_get(c, "ps-kill", &v) != 0 || v.epoch == epoch) {
    if (cluster_now() - t0 > 120) {
      cluster_dump_logs(c);
      fail_msg("ps-kill: no new epoch after the shard's death");
    }
    cluster_sleep(0.05);
  }
  fprintf(stderr, "  ps-kill: epoch %llu at iteration %llu (state %s)\n",
          (unsigned long long)v.epoch, (unsigned long long)v.iteration, v.state);
  assert_string_equal(v.state, "running");
  assert_true(v.iteration < 4000);
  if (cluster_job_wait_state(c, "ps-kill", "succeeded", 180, &v) != 0 ||
      v.members[0].accuracy <= ACC_BOUND)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "succeeded");
  fprintf(stderr, "  ps-kill: epoch %llu -> %llu, %d members\n", (unsigned long long)epoch,
          (unsigned long long)v.epoch, v.nmembers);
  assert_true(v.epoch > epoch);
  assert_int_equal(v.nmembers, 3);
  for (int i = 0; i < v.nmembers; i++) {
    fprintf(stderr, "  ps-kill %s: %s iteration %llu loss %.4f accuracy %.4f\n", v.members[i].name,
            v.members[i].state, (unsigned long long)v.members[i].iteration, v.members[i].loss,
            v.members[i].accuracy);
    assert_string_equal(v.members[i].state, "done");
    assert_true(v.members[i].accuracy > ACC_BOUND);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adpsgd_converges_with_models_closer_than_without_averaging),
      cmocka_unit_test(test_adpsgd_stopped_agent_others_keep_training),
      cmocka_unit_test(test_gradient_delay_reaches_the_agents),
      cmocka_unit_test(test_asgd_and_dc_asgd_train_one_model_from_every_push),
      /* last: it leaves 3 agents */
      cmocka_unit_test(test_asgd_shard_killed_new_epoch_job_finishes),
  };
  if (getenv("WAGMA_TEST_FILTER")) /* e.g. "*shard_killed*" */
    cmocka_set_test_filter(getenv("WAGMA_TEST_FILTER"));
  return cmocka_run_group_tests_name("agent_algorithms", tests, setup, teardown);
}
