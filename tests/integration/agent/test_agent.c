/* test_agent.c — wagma-agent end to end: a real etcd, a real wagma-coordinator and 4 real
 * wagma-agent processes on 127.0.0.1, synthetic data, jobs submitted through the REST API.
 *
 *  - each algorithm (wagma, allreduce, local-sgd) converges: every member reports done with a
 *    training loss under LOSS_BOUND and a test accuracy over ACC_BOUND;
 *  - SIGKILL one agent mid-job: the job goes on with the 3 others in a new epoch, no process
 *    restarts (the survivors' PIDs are unchanged and still alive), the iteration keeps growing;
 *  - PATCH workers 3 -> 4 with a fresh agent: it joins in a new epoch (receiving the model
 *    through the weighted global sync) and trains;
 *  - SIGTERM an agent: it leaves at once (lease revoked), the job replans without waiting for
 *    the lease TTL;
 *  - etcd down for a few seconds: the agents keep training on the last plan (same epoch, same
 *    processes, the iteration grew across the outage);
 *  - every agent SIGKILLed: fresh agents restart the job from its checkpoint (rank 0 wrote it
 *    and recorded it in etcd), not from the seed;
 *  - a job given in epochs ends after epochs x n / (batch x workers) iterations;
 *  - an agent that cannot set a job up (its data set is missing) reports "failed" and the job
 *    fails with the agent's reason.
 * Everything started is stopped by PID (cluster.c). */
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

/* --data-dir points nowhere: synthetic jobs do not need it, Fashion-MNIST jobs must fail. */
static const char *const agent_args[] = {"--lease-ttl",
                                         "6",
                                         "--progress-interval",
                                         "0.3",
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

static void submit(cluster_t *c, const char *fmt, ...) {
  char json[1024], *body = NULL;
  long st = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(json, sizeof json, fmt, ap);
  va_end(ap);
  assert_int_equal(cluster_http(c, "POST", "/v1/jobs", json, &st, &body), 0);
  if (st != 201)
    fprintf(stderr, "submit %s -> %ld %s\n", json, st, body ? body : "");
  free(body);
  assert_int_equal(st, 201);
}

static void patch_workers(cluster_t *c, const char *job, int workers) {
  char path[128], json[64], *body = NULL;
  long st = 0;
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  snprintf(json, sizeof json, "{\"workers\":%d}", workers);
  assert_int_equal(cluster_http(c, "PATCH", path, json, &st, &body), 0);
  if (st != 200)
    fprintf(stderr, "PATCH %s -> %ld %s\n", json, st, body ? body : "");
  free(body);
  assert_int_equal(st, 200);
}

static void delete_job(cluster_t *c, const char *job) {
  char path[128], *body = NULL;
  long st = 0;
  job_view_t v;
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  assert_int_equal(cluster_http(c, "DELETE", path, NULL, &st, &body), 0);
  free(body);
  assert_true(st == 200 || st == 202 || st == 204);
  assert_int_equal(cluster_job_wait_state(c, job, "stopped", 30, &v), 0);
}

/* Waits until the job's status shows an epoch > after with exactly n members and every member
 * reported progress of that epoch beyond min_iter, with a training loss. */
static int wait_epoch(cluster_t *c, const char *job, uint64_t after, int n, uint64_t min_iter,
                      double timeout_s, job_view_t *v) {
  double deadline = cluster_now() + timeout_s;
  while (cluster_now() < deadline) {
    if (cluster_job_get(c, job, v) == 0 && v->epoch > after && v->nmembers == n) {
      int ok = 1;
      for (int i = 0; i < v->nmembers; i++)
        ok &= v->members[i].has_progress && v->members[i].epoch == v->epoch &&
              v->members[i].iteration > min_iter && v->members[i].loss >= 0;
      if (ok)
        return 0;
    }
    cluster_sleep(0.25);
  }
  fprintf(stderr, "job %s: no epoch > %llu with %d members past iteration %llu (epoch %llu, %d)\n",
          job, (unsigned long long)after, n, (unsigned long long)min_iter,
          (unsigned long long)v->epoch, v->nmembers);
  return -1;
}

static int alive(pid_t pid) {
  return pid > 0 && kill(pid, 0) == 0 && waitpid(pid, NULL, WNOHANG) == 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void converge(cluster_t *c, const char *algorithm, const char *extra) {
  char job[64];
  job_view_t v;
  snprintf(job, sizeof job, "conv-%s", algorithm);
  submit(c,
         "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\",\"algorithm\":\"%s\","
         "\"workers\":4,\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,"
         "\"iterations\":160,\"eval_every\":40,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05,"
         "\"momentum\":0.9}%s}",
         job, algorithm, extra);
  if (cluster_job_wait_state(c, job, "succeeded", 120, &v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "succeeded");
  assert_int_equal(v.nmembers, 4);
  for (int i = 0; i < v.nmembers; i++) {
    const job_member_t *m = &v.members[i];
    fprintf(stderr,
            "  %s %s: %s iteration %llu loss %.4f accuracy %.4f activated %llu joined %llu\n", job,
            m->name, m->state, (unsigned long long)m->iteration, m->loss, m->accuracy,
            (unsigned long long)m->rounds_activated, (unsigned long long)m->rounds_joined);
    assert_true(m->has_progress);
    assert_string_equal(m->state, "done");
    assert_true(m->iteration >= 160);
    assert_true(m->loss >= 0 && m->loss < LOSS_BOUND);
    assert_true(m->accuracy > ACC_BOUND);
  }
}

static void test_wagma_converges(void **state) {
  converge(*state, "wagma", "");
}

static void test_wagma_wait_avoiding_converges(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  submit(c, "{\"name\":\"conv-wagma-wa\",\"model\":\"mlp\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"wagma\",\"global_sync\":\"wait-avoiding\",\"workers\":4,"
            "\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,\"iterations\":120,"
            "\"eval_every\":40}");
  if (cluster_job_wait_state(c, "conv-wagma-wa", "succeeded", 120, &v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "succeeded");
  for (int i = 0; i < v.nmembers; i++) {
    assert_true(v.members[i].loss >= 0 && v.members[i].loss < LOSS_BOUND);
    assert_true(v.members[i].accuracy > ACC_BOUND);
  }
}

static void test_allreduce_converges(void **state) {
  converge(*state, "allreduce", "");
}

static void test_local_sgd_converges(void **state) {
  converge(*state, "local-sgd", "");
}

static void test_kill_then_scale_up(void **state) {
  cluster_t *c = *state;
  const char *job = "elastic";
  job_view_t v;
  pid_t before[CLUSTER_MAX_AGENTS];
  submit(c, "{\"name\":\"elastic\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"wagma\",\"workers\":4,\"min_workers\":2,\"group_size\":2,"
            "\"staleness_bound\":4,\"batch_size\":32,\"iterations\":100000000,"
            "\"eval_every\":100}");
  assert_int_equal(cluster_job_wait_state(c, job, "running", 60, &v), 0);
  if (wait_epoch(c, job, 0, 4, 20, 60, &v) != 0)
    cluster_dump_logs(c);
  assert_int_equal(v.nmembers, 4);
  uint64_t epoch0 = v.epoch;
  for (int i = 0; i < c->nagents; i++)
    before[i] = c->agent[i];

  /* SIGKILL the last member: the job goes on with the other 3 in a new epoch. */
  const char *victim = v.members[3].name;
  int vi = -1;
  for (int i = 0; i < c->nagents; i++)
    if (strcmp(c->agent_name[i], victim) == 0)
      vi = i;
  assert_true(vi >= 0);
  assert_int_equal(kill(c->agent[vi], SIGKILL), 0);
  waitpid(c->agent[vi], NULL, 0);
  c->agent[vi] = 0;
  uint64_t iter_at_kill = job_min_iteration(&v);
  if (wait_epoch(c, job, epoch0, 3, iter_at_kill + 30, 60, &v) != 0)
    cluster_dump_logs(c);
  assert_int_equal(v.nmembers, 3);
  assert_null(job_member(&v, victim));
  for (int i = 0; i < c->nagents; i++) {
    if (i == vi)
      continue;
    assert_int_equal(c->agent[i], before[i]);
    assert_true(alive(c->agent[i]));
  }
  uint64_t epoch1 = v.epoch;

  /* Scale to 3 (the current size), add a fresh agent: it stays free; PATCH 3 -> 4: it joins. */
  patch_workers(c, job, 3);
  int fresh = cluster_add_agent(c, NULL);
  assert_true(fresh >= 0);
  assert_int_equal(cluster_wait_agents(c, 4, 30), 0);
  cluster_sleep(1.0);
  assert_int_equal(cluster_job_get(c, job, &v), 0);
  assert_int_equal(v.nmembers, 3);
  assert_null(job_member(&v, c->agent_name[fresh]));
  uint64_t iter_before_join = job_min_iteration(&v);
  patch_workers(c, job, 4);
  if (wait_epoch(c, job, epoch1, 4, iter_before_join + 30, 60, &v) != 0)
    cluster_dump_logs(c);
  const job_member_t *m = job_member(&v, c->agent_name[fresh]);
  assert_non_null(m);
  /* The joiner took the iteration from its peers (weighted global sync), not 0. */
  assert_true(m->iteration > iter_before_join);
  assert_true(m->loss >= 0 && m->loss < LOSS_BOUND);
  for (int i = 0; i < c->nagents; i++)
    if (i != vi && i != fresh)
      assert_int_equal(c->agent[i], before[i]);

  /* SIGTERM one member: it revokes its lease, so the replan comes before the 6 s TTL. */
  uint64_t epoch2 = v.epoch;
  int leaver = fresh;
  double t0 = cluster_now();
  assert_int_equal(kill(c->agent[leaver], SIGTERM), 0);
  if (wait_epoch(c, job, epoch2, 3, 0, 30, &v) != 0)
    cluster_dump_logs(c);
  double replan_s = cluster_now() - t0;
  fprintf(stderr, "  replan after SIGTERM: %.2f s\n", replan_s);
  assert_null(job_member(&v, c->agent_name[leaver]));
  int status = 0;
  assert_int_equal(waitpid(c->agent[leaver], &status, 0), c->agent[leaver]);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  c->agent[leaver] = 0;
  delete_job(c, job);
}

static void test_etcd_outage(void **state) {
  cluster_t *c = *state;
  const char *job = "outage";
  job_view_t v;
  submit(c, "{\"name\":\"outage\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"wagma\",\"global_sync\":\"wait-avoiding\",\"workers\":3,"
            "\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,"
            "\"iterations\":100000000,\"eval_every\":100}");
  if (wait_epoch(c, job, 0, 3, 20, 60, &v) != 0)
    cluster_dump_logs(c);
  assert_int_equal(v.nmembers, 3);
  uint64_t epoch = v.epoch;
  pid_t pids[CLUSTER_MAX_AGENTS];
  for (int i = 0; i < c->nagents; i++)
    pids[i] = c->agent[i];
  cluster_sleep(0.5);
  assert_int_equal(cluster_job_get(c, job, &v), 0);
  uint64_t before = job_min_iteration(&v);
  assert_int_equal(etcd_fixture_kill(c->etcd, 0), 0);
  cluster_sleep(3.0);
  for (int i = 0; i < c->nagents; i++)
    if (pids[i])
      assert_true(alive(pids[i]));
  assert_int_equal(etcd_fixture_restart(c->etcd, 0), 0);
  /* Progress written after the outage shows training went on through it. */
  double deadline = cluster_now() + 30;
  uint64_t after = 0;
  while (cluster_now() < deadline) {
    if (cluster_job_get(c, job, &v) == 0 && v.nmembers == 3 &&
        (after = job_min_iteration(&v)) > before + 100)
      break;
    cluster_sleep(0.25);
  }
  fprintf(stderr, "  iteration %llu before the outage, %llu after\n", (unsigned long long)before,
          (unsigned long long)after);
  if (after <= before + 100)
    cluster_dump_logs(c);
  assert_true(after > before + 100);
  assert_int_equal(v.epoch, epoch);
  for (int i = 0; i < c->nagents; i++)
    assert_int_equal(c->agent[i], pids[i]);
  delete_job(c, job);
}

static int log_contains(const cluster_t *c, int agent, const char *needle) {
  char path[320], line[1024];
  int found = 0;
  snprintf(path, sizeof path, "%s/agent-%d.log", c->dir, agent);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static void test_restart_from_checkpoint(void **state) {
  cluster_t *c = *state;
  const char *job = "resume";
  job_view_t v;
  int live[CLUSTER_MAX_AGENTS], nlive = 0;
  submit(c,
         "{\"name\":\"resume\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
         "\"algorithm\":\"wagma\",\"workers\":2,\"group_size\":2,\"staleness_bound\":4,"
         "\"batch_size\":32,\"iterations\":100000000,\"eval_every\":100,"
         "\"checkpoint\":{\"every\":300,\"path\":\"%s/ckpt\"}}",
         c->dir);
  if (wait_epoch(c, job, 0, 2, 700, 60, &v) != 0)
    cluster_dump_logs(c);
  assert_int_equal(v.nmembers, 2);
  /* Kill every member at once: nobody survives to hand the model over. */
  for (int i = 0; i < c->nagents; i++)
    if (c->agent[i] > 0 && job_member(&v, c->agent_name[i])) {
      kill(c->agent[i], SIGKILL);
      waitpid(c->agent[i], NULL, 0);
      c->agent[i] = 0;
    }
  for (int i = 0; i < c->nagents; i++)
    if (c->agent[i] > 0)
      live[nlive++] = i;
  /* Fresh agents (and the free ones) take the job over from its checkpoint. */
  int a = cluster_add_agent(c, NULL), b = cluster_add_agent(c, NULL);
  assert_true(a >= 0 && b >= 0);
  uint64_t epoch0 = v.epoch;
  if (wait_epoch(c, job, epoch0, 2, 0, 60, &v) != 0)
    cluster_dump_logs(c);
  int resumed = 0;
  for (int i = 0; i < v.nmembers; i++)
    for (int k = 0; k < c->nagents; k++)
      if (strcmp(v.members[i].name, c->agent_name[k]) == 0)
        resumed += log_contains(c, k, "job resume: resumed from checkpoint");
  (void)live;
  (void)nlive;
  assert_int_equal(resumed, 2);
  assert_true(job_min_iteration(&v) >= 300);
  delete_job(c, job);
}

static void test_epochs_job(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  /* 4096 synthetic samples / (32 x 4 workers) = 32 iterations per epoch. */
  submit(c, "{\"name\":\"two-epochs\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"allreduce\",\"workers\":4,\"batch_size\":32,\"epochs\":2,"
            "\"eval_every\":16}");
  if (cluster_job_wait_state(c, "two-epochs", "succeeded", 60, &v) != 0)
    cluster_dump_logs(c);
  assert_string_equal(v.state, "succeeded");
  for (int i = 0; i < v.nmembers; i++) {
    assert_string_equal(v.members[i].state, "done");
    assert_int_equal(v.members[i].iteration, 64);
  }
}

static void test_setup_failure_fails_the_job(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  char *body = NULL;
  long st = 0;
  /* The agents run with --data-dir /nonexistent/...: Fashion-MNIST cannot load. */
  submit(c, "{\"name\":\"no-data\",\"model\":\"mlp\",\"dataset\":\"fashion-mnist\","
            "\"workers\":2,\"iterations\":10}");
  assert_int_equal(cluster_job_wait_state(c, "no-data", "failed", 60, &v), 0);
  assert_int_equal(cluster_http(c, "GET", "/v1/jobs/no-data", NULL, &st, &body), 0);
  fprintf(stderr, "  %s\n", body);
  assert_non_null(strstr(body, "setup failed"));
  free(body);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wagma_converges),
      cmocka_unit_test(test_allreduce_converges),
      cmocka_unit_test(test_local_sgd_converges),
      cmocka_unit_test(test_wagma_wait_avoiding_converges),
      cmocka_unit_test(test_epochs_job),
      cmocka_unit_test(test_setup_failure_fails_the_job),
      cmocka_unit_test(test_kill_then_scale_up),
      cmocka_unit_test(test_etcd_outage),
      cmocka_unit_test(test_restart_from_checkpoint),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
