/* test_agent_programs.c — programs launched by agents (issue 25, docs/programs.md): a real etcd, a
 * real wagma-coordinator and 4 real wagma-agent processes on 127.0.0.1 with --programs DIR; DIR
 * holds examples/c/minimal (logistic regression on libwagma) and small misbehaving programs.
 *
 *  - minimal trains under wagma, allreduce and local-sgd: the job succeeds, every member's test
 *    accuracy is above ACC_BOUND and the members' models ended close (fingerprints before the
 *    final average, within test_agent's bound), each member's progress shows the program's
 *    epoch and iterations;
 *  - minimal linked with the static libwagma.a trains the same wagma job;
 *  - device buffers (wagma_worker_use_cuda) without a GPU: program_device.c keeps its model in
 *    tests/fake_cudart's "device" memory, which faults on any direct touch; under wagma and
 *    allreduce the job trains as minimal's, and every step went through libwagma's staging;
 *  - arguments with shell metacharacters reach the program verbatim (it echoes its argv);
 *  - a program that exits 1 at once fails the job with its stderr in the reason;
 *  - one that never connects is killed after --program-connect-timeout and fails the job;
 *  - one that writes garbage on the socket fails the job; its agent stays up and registered;
 *  - SIGKILL of one member's program: the agent restarts it, the member rejoins as a joiner in
 *    a new epoch (the timeline says so; the new process receives the model) within the lease
 *    TTL + 1 s, the other members' programs keep their PIDs;
 *  - SIGKILL of an agent: its program is gone within 1 s, the survivors' programs train on in
 *    the next epoch (3 members);
 *  - an agent whose --listen port is taken fails its start (exit 2).
 * Everything started is stopped by PID (cluster.c; the programs die with their agents). */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "process.h"

#define ACC_BOUND 0.95
#define SPREAD_BOUND 0.05 /* test_agent.c's: fingerprints of models that were averaged */

static char programs_dir[256];
static const char *agent_args[16];

static void write_program(const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", programs_dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  chmod(path, 0755);
}

static int setup(void **state) {
  snprintf(programs_dir, sizeof programs_dir, "/tmp/wagma-programs.XXXXXX");
  if (!mkdtemp(programs_dir))
    return -1;
  char path[512];
  snprintf(path, sizeof path, "%s/minimal", programs_dir);
  if (symlink(getenv("WAGMA_MINIMAL_BIN"), path) != 0)
    return -1;
  snprintf(path, sizeof path, "%s/minimal-static", programs_dir);
  if (symlink(getenv("WAGMA_MINIMAL_STATIC_BIN"), path) != 0)
    return -1;
  snprintf(path, sizeof path, "%s/device", programs_dir);
  if (symlink(getenv("WAGMA_DEVICE_PROGRAM_BIN"), path) != 0)
    return -1;
  static char cudart[600];
  snprintf(cudart, sizeof cudart, "WAGMA_CUDART=%s", getenv("WAGMA_FAKE_CUDART"));
  write_program("fail", "#!/bin/sh\necho 'boom: the program cannot start' >&2\nexit 1\n");
  write_program("sleeper", "#!/bin/sh\nexec sleep 120\n");
  write_program("garbage",
                "#!/usr/bin/python3\nimport os, socket, time\n"
                "s = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['WAGMA_AGENT_SOCKET'])\n"
                "s.sendall(b'\\x05\\x00\\x00\\x00hello')\ntime.sleep(60)\n");
  int n = 0;
  agent_args[n++] = "--lease-ttl";
  agent_args[n++] = "3";
  agent_args[n++] = "--progress-interval";
  agent_args[n++] = "0.2";
  agent_args[n++] = "--programs";
  agent_args[n++] = programs_dir;
  agent_args[n++] = "--program-connect-timeout";
  agent_args[n++] = "2";
  agent_args[n++] = "--program-grace";
  agent_args[n++] = "2";
  agent_args[n++] = "--program-env";
  agent_args[n++] = cudart;
  agent_args[n] = NULL;
  return cluster_group_setup(state, 4, agent_args);
}

static int teardown(void **state) {
  int rc = cluster_group_teardown(state);
  const char *names[] = {"minimal", "minimal-static", "device", "fail", "sleeper", "garbage"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", programs_dir, names[i]);
    unlink(path);
  }
  rmdir(programs_dir);
  return rc;
}

/* Waits until the job is terminal; returns its view. */
static void wait_end(cluster_t *c, const char *job, const char *want, job_view_t *v) {
  if (cluster_job_wait_state(c, job, want, 60, v) != 0 || strcmp(v->state, want) != 0) {
    fprintf(stderr, "job %s: %s (%s), wanted %s\n", job, v->state, v->reason, want);
    cluster_dump_logs(c);
  }
  assert_string_equal(v->state, want);
}

static void train_program(cluster_t *c, const char *program, const char *algorithm,
                          job_view_t *out) {
  job_view_t v;
  char job[64];
  snprintf(job, sizeof job, "%s-%s", strcmp(program, "minimal") ? program : "prog", algorithm);
  assert_int_equal(cluster_job_submit(c,
                                      "{\"name\":\"%s\",\"program\":{\"name\":\"%s\"},"
                                      "\"algorithm\":\"%s\",\"workers\":4,\"iterations\":600,"
                                      "\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32}",
                                      job, program, algorithm),
                   0);
  wait_end(c, job, "succeeded", &v);
  double spread = job_fingerprint_spread(&v);
  fprintf(stderr, "  %s: accuracy %.4f (%.4f-%.4f over %d), spread %.2e, %.2f s\n", algorithm,
          v.summary.accuracy_mean, v.summary.accuracy_min, v.summary.accuracy_max,
          v.summary.evaluated, spread, v.summary.wall_time);
  assert_int_equal(v.summary.evaluated, 4);
  assert_true(v.summary.accuracy_min > ACC_BOUND);
  /* the models as trained (fingerprints before the final average) ended close */
  assert_true(spread >= 0 && spread < SPREAD_BOUND);
  for (int i = 0; i < v.nmembers; i++) {
    assert_string_equal(v.members[i].state, "done");
    assert_int_equal(v.members[i].iteration, 600);
    assert_true(v.members[i].epoch >= 1);
  }
  if (out)
    *out = v;
}

static void train(cluster_t *c, const char *algorithm) {
  train_program(c, "minimal", algorithm, NULL);
}

/* libwagma's device buffers (wagma_worker_use_cuda) over tests/fake_cudart: program_device.c
 * fails its member unless the library staged every step through its mirrors, and any direct
 * touch of device memory kills it; each member printed how many copies the library made. */
static void device_buffers(cluster_t *c, const char *algorithm) {
  job_view_t v;
  char job[64];
  train_program(c, "device", algorithm, &v);
  snprintf(job, sizeof job, "device-%s", algorithm);
  for (int i = 0; i < v.nmembers; i++) {
    int k = cluster_agent_index(c, v.members[i].name);
    assert_int_equal(cluster_agent_log_count(c, k, job, "device: library copies"), 1);
    assert_int_equal(cluster_agent_log_count(c, k, job, "over 0 steps"), 0);
  }
}

/* minimal linked with the static libwagma.a: the same job, no libwagma.so at run time (the
 * program's ELF needs no libwagma: checked by the test test_libwagma_static_linked). */
static void test_static_library(void **state) {
  train_program(*state, "minimal-static", "wagma", NULL);
}

static void test_device_buffers_wagma(void **state) {
  device_buffers(*state, "wagma");
}
static void test_device_buffers_allreduce(void **state) {
  device_buffers(*state, "allreduce");
}

static void test_wagma(void **state) {
  train(*state, "wagma");
}
static void test_allreduce(void **state) {
  train(*state, "allreduce");
}
static void test_local_sgd(void **state) {
  train(*state, "local-sgd");
}

/* argv reaches the program as given: no shell in between. */
static void test_args_verbatim(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(
      cluster_job_submit(c, "{\"name\":\"prog-args\",\"program\":{\"name\":\"minimal\",\"args\":"
                            "[\"--echo-args\",\"; rm -rf /tmp/x\",\"$(id)\",\"a b\",\"'q'\"]},"
                            "\"workers\":1,\"iterations\":20}"),
      0);
  wait_end(c, "prog-args", "succeeded", &v);
  const char *want[] = {"arg 2: ; rm -rf /tmp/x", "arg 3: $(id)", "arg 4: a b", "arg 5: 'q'"};
  int member = cluster_agent_index(c, v.members[0].name);
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    int n = cluster_agent_log_count(c, member, want[i], "prog-args");
    if (n != 1)
      fprintf(stderr, "\"%s\" in the log of %s: %d times\n", want[i], v.members[0].name, n);
    assert_int_equal(n, 1);
  }
}

static void test_exit_at_once(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"prog-fail\",\"program\":{\"name\":\"fail\"},"
                                         "\"workers\":2,\"iterations\":20}"),
                   0);
  wait_end(c, "prog-fail", "failed", &v);
  fprintf(stderr, "  reason: %s\n", v.reason);
  assert_non_null(strstr(v.reason, "exited with status 1"));
  assert_non_null(strstr(v.reason, "boom: the program cannot start"));
}

static void test_never_connects(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  double t0 = cluster_now();
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"prog-sleep\",\"program\":{\"name\":"
                                         "\"sleeper\"},\"workers\":1,\"iterations\":20}"),
                   0);
  wait_end(c, "prog-sleep", "failed", &v);
  fprintf(stderr, "  reason after %.1f s: %s\n", cluster_now() - t0, v.reason);
  assert_non_null(strstr(v.reason, "did not connect within 2 s"));
}

static void test_garbage(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  if (access("/usr/bin/python3", X_OK) != 0)
    skip();
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"prog-garbage\",\"program\":{\"name\":"
                                         "\"garbage\"},\"workers\":1,\"iterations\":20}"),
                   0);
  wait_end(c, "prog-garbage", "failed", &v);
  fprintf(stderr, "  reason: %s\n", v.reason);
  assert_non_null(strstr(v.reason, "broke the protocol"));
  /* its agent is up and registered */
  int member = -1;
  for (int i = 0; i < c->nagents; i++)
    if (cluster_agent_log_count(c, i, "prog-garbage", "broke the protocol") > 0)
      member = i;
  assert_true(member >= 0);
  assert_int_equal(kill(c->agent[member], 0), 0);
  json_t *a = cluster_agent_get(c, c->agent_name[member]);
  assert_non_null(a);
  json_decref(a);
}

/* Gone: no such process, or a zombie nobody reaped yet. */
static int process_gone(pid_t pid) {
  char path[64], stat[256];
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return 1;
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 1;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = '\0';
  const char *rp = strrchr(stat, ')');
  return rp && rp[1] == ' ' && rp[2] == 'Z';
}

/* The job's timeline (GET .../events) holds text. */
static int timeline_has(const cluster_t *c, const char *job, const char *text) {
  char path[128], *body = NULL;
  long st = 0;
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
  int has = cluster_http(c, "GET", path, NULL, &st, &body) == 0 && st == 200 && body &&
            strstr(body, text) != NULL;
  free(body);
  return has;
}

static void test_program_killed_restarts(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"prog-restart\",\"program\":{\"name\":"
                                         "\"minimal\"},\"workers\":4,\"iterations\":100000000,"
                                         "\"group_size\":2}"),
                   0);
  assert_true(cluster_wait_training(c, "prog-restart", 0, 4, 50, 30, &v) >= 0);
  uint64_t epoch = v.epoch;
  pid_t pids[4];
  int idx[4];
  for (int i = 0; i < 4; i++) {
    idx[i] = cluster_agent_index(c, v.members[i].name);
    pids[i] = cluster_program_pid(c, idx[i], "prog-restart");
    assert_true(pids[i] > 0);
  }
  assert_int_equal(kill(pids[1], SIGKILL), 0);
  double waited = cluster_wait_training(c, "prog-restart", epoch, 4, 20, 30, &v);
  fprintf(stderr, "  4 members training in epoch %llu %.2f s after the kill\n",
          (unsigned long long)v.epoch, waited);
  if (waited < 0)
    cluster_dump_logs(c);
  assert_true(waited >= 0 && waited <= 3 + 1);
  /* a new process for the killed one, the same processes for the others */
  pid_t again = cluster_program_pid(c, idx[1], "prog-restart");
  assert_true(again > 0 && again != pids[1]);
  for (int i = 0; i < 4; i++)
    if (i != 1)
      assert_int_equal(cluster_program_pid(c, idx[i], "prog-restart"), pids[i]);
  assert_true(cluster_agent_log_count(c, idx[1], "restarting it as a joiner", "prog-restart") == 1);
  assert_true(cluster_agent_log_count(c, idx[1], "joined: model and", "prog-restart") >= 1);
  assert_true(timeline_has(c, "prog-restart", "rejoined after its program restarted"));
  assert_true(timeline_has(c, "prog-restart", "its program restarted"));
  assert_int_equal(cluster_job_stop(c, "prog-restart", 30), 0);
}

static void test_agent_killed(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"prog-churn\",\"program\":{\"name\":"
                                         "\"minimal\"},\"workers\":4,\"min_workers\":2,"
                                         "\"iterations\":100000000,\"group_size\":2}"),
                   0);
  assert_true(cluster_wait_training(c, "prog-churn", 0, 4, 50, 30, &v) >= 0);
  int victim = cluster_agent_index(c, v.members[3].name);
  pid_t prog = cluster_program_pid(c, victim, "prog-churn");
  assert_true(prog > 0);
  assert_int_equal(kill(prog, 0), 0);
  uint64_t epoch = v.epoch;
  assert_int_equal(kill(c->agent[victim], SIGKILL), 0);
  double t0 = cluster_now();
  while (!process_gone(prog) && cluster_now() - t0 < 1.0)
    cluster_sleep(0.02);
  fprintf(stderr, "  program %d of the killed agent gone after %.2f s\n", (int)prog,
          cluster_now() - t0);
  assert_true(process_gone(prog));
  waitpid(c->agent[victim], NULL, 0);
  c->agent[victim] = 0;
  /* the survivors' programs train on in the next epoch, without a restart */
  pid_t before[4];
  for (int i = 0; i < 3; i++)
    before[i] = cluster_program_pid(c, cluster_agent_index(c, v.members[i].name), "prog-churn");
  double waited = cluster_wait_training(c, "prog-churn", epoch, 3, 50, 30, &v);
  fprintf(stderr, "  3 members training in epoch %llu after %.1f s\n", (unsigned long long)v.epoch,
          waited);
  assert_true(waited >= 0);
  for (int i = 0; i < 3; i++) {
    int idx = cluster_agent_index(c, v.members[i].name);
    pid_t now = cluster_program_pid(c, idx, "prog-churn");
    int found = 0;
    for (int k = 0; k < 3; k++)
      found |= before[k] == now;
    assert_true(found); /* the same process: never restarted */
  }
  assert_int_equal(cluster_job_stop(c, "prog-churn", 30), 0);
}

/* Every agent binds --listen at start (its programs inherit the socket): a taken port fails
 * the start, exit 2, "cannot bind" (no --programs needed). */
static void test_port_in_use(void **state) {
  cluster_t *c = *state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(fd, 1), 0);
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  char listen_addr[64], log[512];
  snprintf(listen_addr, sizeof listen_addr, "127.0.0.1:%d", ntohs(sa.sin_port));
  snprintf(log, sizeof log, "%s/port-in-use.log", c->dir);
  const char *argv[] = {getenv("WAGMA_AGENT_BIN"),
                        "--etcd",
                        etcd_fixture_endpoints(c->etcd),
                        "--name",
                        "taken",
                        "--listen",
                        listen_addr,
                        NULL};
  double t0 = cluster_now();
  pid_t pid = proc_spawn(argv, log, NULL);
  int st = proc_wait(pid, 10);
  close(fd);
  assert_true(st >= 0 && WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_true(cluster_now() - t0 < 5);
  FILE *f = fopen(log, "r");
  char text[1024] = "";
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = '\0';
  if (f)
    fclose(f);
  assert_non_null(strstr(text, "cannot bind"));
}

int main(void) {
  if (!getenv("WAGMA_MINIMAL_BIN")) {
    fprintf(stderr, "WAGMA_MINIMAL_BIN is not set (CMake sets it)\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wagma),
      cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_local_sgd),
      cmocka_unit_test(test_static_library),
      cmocka_unit_test(test_device_buffers_wagma),
      cmocka_unit_test(test_device_buffers_allreduce),
      cmocka_unit_test(test_args_verbatim),
      cmocka_unit_test(test_exit_at_once),
      cmocka_unit_test(test_never_connects),
      cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_port_in_use),
      cmocka_unit_test(test_program_killed_restarts),
      cmocka_unit_test(test_agent_killed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
