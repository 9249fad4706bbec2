/* test_algorithm_defaults.c — the per-algorithm defaults train, and a finished job says how it
 * ended (issue 24): a real etcd, a real wagma-coordinator and 4 real wagma-agent processes on
 * 127.0.0.1, Fashion-MNIST from Debian's dataset-fashion-mnist, jobs through the REST API.
 *
 *  - every algorithm (wagma, allreduce, local-sgd, adpsgd, asgd, dc-asgd) with NO optimizer in
 *    the spec trains a 4-agent MLP to a test accuracy above ACC_BOUND in 600 iterations; the
 *    stored spec shows the defaults it got (momentum 0 for asgd and dc-asgd, 0.9 for the
 *    others) and no warning;
 *  - the status summary of each finished job matches its members' final reports (mean, min,
 *    max of the accuracy over 4 members, the iterations, a wall time within started..finished),
 *    the "state" event of its timeline carries the same summary, and `wagmactl get` prints it
 *    on its "result:" line; no agent logged a warning about the job's data plane (nothing
 *    failed);
 *  - asgd with momentum 0.9 (the old default) is known to train badly: the job says so in
 *    its "warnings" and its "submitted" event, and it does train badly (failed, or a summary
 *    accuracy below 0.5): the warning is not crying wolf.
 * Everything started is stopped by PID (cluster.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "cluster.h"
#include "process.h"

#define ACC_BOUND 0.80
#define ITERATIONS 600

static const char *agent_args[] = {
    "--lease-ttl", "5", "--progress-interval", "0.2", "--eval-samples", "1000", NULL};

static int setup(void **state) {
  return cluster_group_setup(state, 4, agent_args);
}

static int teardown(void **state) {
  return cluster_group_teardown(state);
}

/* GET path as JSON (200), or NULL. */
static json_t *get_json(const cluster_t *c, const char *path) {
  long st = 0;
  char *body = NULL;
  if (cluster_http(c, "GET", path, NULL, &st, &body) != 0 || st != 200) {
    free(body);
    return NULL;
  }
  json_t *o = json_loads(body, 0, NULL);
  free(body);
  return o;
}

/* The job's timeline entry of type (the last one), with a new reference, or NULL. */
static json_t *timeline_entry(const cluster_t *c, const char *job, const char *type) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
  json_t *o = get_json(c, path), *found = NULL, *e;
  size_t i;
  json_array_foreach(json_object_get(o, "events"), i, e) {
    if (strcmp(json_string_value(json_object_get(e, "type")) ?: "", type) == 0) {
      json_decref(found);
      found = json_incref(e);
    }
  }
  json_decref(o);
  return found;
}

/* The stored spec's optimizer.momentum of job. */
static double stored_momentum(const cluster_t *c, const char *job) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  json_t *o = get_json(c, path);
  json_t *m = json_object_get(json_object_get(json_object_get(o, "spec"), "optimizer"), "momentum");
  double x = json_is_number(m) ? json_number_value(m) : -1;
  json_decref(o);
  return x;
}

/* `wagmactl --server API get JOB` into out (len bytes); 0 when it exited 0. */
static int wagmactl_get(const cluster_t *c, const char *job, char *out, size_t len) {
  char log[512];
  snprintf(log, sizeof log, "%s/wagmactl-%s.out", c->dir, job);
  remove(log);
  const char *argv[] = {getenv("WAGMACTL_BIN"), "--server", c->api, "get", job, NULL};
  pid_t pid = proc_spawn(argv, log, NULL);
  int st = pid > 0 ? proc_wait(pid, 30) : -1;
  FILE *f = fopen(log, "r");
  size_t n = f ? fread(out, 1, len - 1, f) : 0;
  out[n] = '\0';
  if (f)
    fclose(f);
  return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* The summary of a succeeded job against its members' final reports, its timeline and
 * wagmactl. */
static void check_summary(const cluster_t *c, const char *job, const job_view_t *v) {
  double sum = 0, mn = INFINITY, mx = -INFINITY;
  int n = 0;
  for (int i = 0; i < v->nmembers; i++) {
    const job_member_t *m = &v->members[i];
    assert_string_equal(m->state, "done");
    if (m->accuracy >= 0) {
      sum += m->accuracy;
      mn = fmin(mn, m->accuracy);
      mx = fmax(mx, m->accuracy);
      n++;
    }
  }
  assert_int_equal(v->summary.members, v->nmembers);
  assert_int_equal(v->summary.evaluated, n);
  assert_true(n >= 1);
  assert_true(fabs(v->summary.accuracy_mean - sum / n) < 1e-9);
  assert_true(fabs(v->summary.accuracy_min - mn) < 1e-12);
  assert_true(fabs(v->summary.accuracy_max - mx) < 1e-12);
  assert_true(isfinite(v->summary.loss_mean));
  assert_int_equal(v->summary.iterations, ITERATIONS);
  assert_true(v->summary.wall_time > 0);
  /* (times travel as JSON reals: a few digits of a unix time are lost) */
  assert_true(v->summary.wall_time <= v->finished - v->started + 0.01);

  json_t *e = timeline_entry(c, job, "state");
  assert_non_null(e);
  assert_string_equal(json_string_value(json_object_get(e, "to")), "succeeded");
  json_t *es = json_object_get(e, "summary");
  assert_true(json_is_object(es));
  double emean = json_number_value(json_object_get(json_object_get(es, "accuracy"), "mean"));
  assert_true(fabs(emean - v->summary.accuracy_mean) < 1e-9);
  assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "test accuracy"));
  json_decref(e);

  char out[8192], want[64];
  assert_int_equal(wagmactl_get(c, job, out, sizeof out), 0);
  snprintf(want, sizeof want, "result:       test accuracy %.4f", v->summary.accuracy_mean);
  if (!strstr(out, want))
    fprintf(stderr, "wagmactl get %s printed:\n%s\n(wanted \"%s\")\n", job, out, want);
  assert_non_null(strstr(out, want));
}

static void train_with_defaults(cluster_t *c, const char *algorithm, double want_momentum) {
  job_view_t v;
  char job[64];
  snprintf(job, sizeof job, "defaults-%s", algorithm);
  assert_int_equal(cluster_job_submit(c,
                                      "{\"name\":\"%s\",\"model\":\"mlp\",\"dataset\":"
                                      "\"fashion-mnist\",\"algorithm\":\"%s\",\"workers\":4,"
                                      "\"iterations\":%d,\"eval_every\":200,\"seed\":7}",
                                      job, algorithm, ITERATIONS),
                   0);
  assert_true(fabs(stored_momentum(c, job) - want_momentum) < 1e-12);
  if (cluster_job_wait_state(c, job, "succeeded", 240, &v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "succeeded");
  fprintf(stderr,
          "  %s (momentum %.1f): test accuracy %.4f (%.4f-%.4f over %d), loss %.4f, %.1f s\n",
          algorithm, want_momentum, v.summary.accuracy_mean, v.summary.accuracy_min,
          v.summary.accuracy_max, v.summary.evaluated, v.summary.loss_mean, v.summary.wall_time);
  assert_int_equal(v.nwarnings, 0);
  assert_true(v.summary.accuracy_min > ACC_BOUND);
  check_summary(c, job, &v);
  /* nothing failed, so no agent warned about its data plane (the workers of asgd and dc-asgd
   * used to warn at every start: a shard not in the epoch yet) */
  char needle[96];
  snprintf(needle, sizeof needle, "job %s epoch", job);
  for (int i = 0; i < c->nagents; i++) {
    int n = cluster_agent_log_count(c, i, needle, "WARN");
    if (n)
      cluster_dump_logs(c);
    assert_int_equal(n, 0);
  }
}

static void test_wagma(void **state) {
  train_with_defaults(*state, "wagma", 0.9);
}
static void test_allreduce(void **state) {
  train_with_defaults(*state, "allreduce", 0.9);
}
static void test_local_sgd(void **state) {
  train_with_defaults(*state, "local-sgd", 0.9);
}
static void test_adpsgd(void **state) {
  train_with_defaults(*state, "adpsgd", 0.9);
}
static void test_asgd(void **state) {
  train_with_defaults(*state, "asgd", 0.0);
}
static void test_dc_asgd(void **state) {
  train_with_defaults(*state, "dc-asgd", 0.0);
}

/* The old default for asgd: warned about at submission, and it does train badly. */
static void test_asgd_momentum_warned(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c,
                                      "{\"name\":\"asgd-momentum\",\"model\":\"mlp\","
                                      "\"dataset\":\"fashion-mnist\",\"algorithm\":\"asgd\","
                                      "\"workers\":4,\"iterations\":%d,\"eval_every\":200,"
                                      "\"seed\":7,\"optimizer\":{\"momentum\":0.9}}",
                                      ITERATIONS),
                   0);
  json_t *e = timeline_entry(c, "asgd-momentum", "submitted");
  for (double t0 = cluster_now(); !e && cluster_now() - t0 < 10; cluster_sleep(0.2))
    e = timeline_entry(c, "asgd-momentum", "submitted");
  assert_non_null(e);
  assert_int_equal(json_array_size(json_object_get(e, "warnings")), 1);
  assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "warning: optimizer"));
  json_decref(e);
  if (cluster_job_wait_state(c, "asgd-momentum", "succeeded", 240, &v) != 0 &&
      strcmp(v.state, "failed") != 0)
    cluster_dump_logs(c);
  fprintf(stderr, "  asgd (momentum 0.9): %s, test accuracy %.4f over %d, loss %g\n", v.state,
          v.summary.accuracy_mean, v.summary.evaluated, v.summary.loss_mean);
  assert_int_equal(v.nwarnings, 1);
  assert_true(strcmp(v.state, "failed") == 0 ||
              (strcmp(v.state, "succeeded") == 0 && v.summary.accuracy_mean < 0.5));
  assert_true(v.summary.members > 0); /* failed or not, it has a summary */
}

int main(void) {
  if (!getenv("WAGMACTL_BIN")) {
    fprintf(stderr, "WAGMACTL_BIN is not set (CMake sets it)\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wagma),
      cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_local_sgd),
      cmocka_unit_test(test_adpsgd),
      cmocka_unit_test(test_asgd),
      cmocka_unit_test(test_dc_asgd),
      cmocka_unit_test(test_asgd_momentum_warned),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
