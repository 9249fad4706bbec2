/* test_wagmactl_cli.c — the wagmactl binary against a real etcd (tests/support fixture) and a
 * real wagma-coordinator process with a bearer token, both on free 127.0.0.1 ports. Agents
 * are faked as registration keys (and progress records) written with libwagma_etcd.
 *
 * Every command is run as a child process (stdout, stderr and the exit code captured, a
 * deadline on each run): help, health, agents, submit (file, stdin, invalid spec, no/wrong
 * token, duplicate, missing file), list, get (with progress), groups (current, a group
 * round, a global round), plan, scale (ok, out of range), stop, stop --purge, 404s, and
 * finally an unreachable server (exit 3, fast) and a server that never answers (exit 3 at
 * the --timeout). The tests run in order and share the cluster. Everything started is
 * stopped by PID. */
#define _GNU_SOURCE /* asprintf */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>

#include "coordinator_process.h"
#include "etcd_fixture.h"
#include "process.h"
#include "wagma/etcd.h"

#ifndef WAGMACTL_BIN
#error "WAGMACTL_BIN must be defined"
#endif
#ifndef WAGMA_COORDINATOR_BIN
#error "WAGMA_COORDINATOR_BIN must be defined"
#endif

#define TOKEN "ctl-test-token-42"
#define RUN_DEADLINE_S 30.0
#define NAGENTS 4

typedef struct cluster {
  etcd_fixture_t *etcd;
  wagma_etcd_t *kv;
  coordinator_process_t coord;
  char server[64];
  char dir[128]; /* temp dir: token file, spec files, outputs, coordinator log */
  char token_file[192];
  char coord_log[192];
} cluster_t;

static cluster_t C;

/* ---- small helpers ------------------------------------------------------------------------- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return strdup("");
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
    fwrite(chunk, 1, n, m);
  fclose(m);
  fclose(f);
  return buf;
}

/* ---- running wagmactl ---------------------------------------------------------------------- */

typedef struct run {
  int code;    /* exit code; -1 when killed at the deadline or by a signal */
  char *out;   /* stdout, owned */
  char *err;   /* stderr, owned */
  double secs; /* wall time */
} run_t;

static void run_free(run_t *r) {
  free(r->out);
  free(r->err);
  memset(r, 0, sizeof *r);
}

/* Runs wagmactl with argv (NULL-terminated, without argv[0]) and stdin from stdin_path
 * (NULL = /dev/null). The environment has no WAGMA_TOKEN and WAGMA_SERVER = our server
 * unless server_env is given ("" = unset). */
static void run_ctl_v(run_t *r, const char *stdin_path, const char *server_env,
                      const char *const *args) {
  char out_path[256], err_path[256];
  snprintf(out_path, sizeof out_path, "%s/out", C.dir);
  snprintf(err_path, sizeof err_path, "%s/err", C.dir);
  const char *argv[40] = {WAGMACTL_BIN};
  int n = 1;
  for (; args[n - 1] && n < 39; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;
  double t0 = proc_now();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int in = open(stdin_path ? stdin_path : "/dev/null", O_RDONLY);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0)
      _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    unsetenv("WAGMA_TOKEN");
    const char *srv = server_env ? server_env : C.server;
    if (*srv)
      setenv("WAGMA_SERVER", srv, 1);
    else
      unsetenv("WAGMA_SERVER");
    setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    setenv("no_proxy", "127.0.0.1,localhost", 1);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = proc_wait(pid, RUN_DEADLINE_S);
  r->secs = proc_now() - t0;
  r->code = (status >= 0 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  r->out = read_file(out_path);
  r->err = read_file(err_path);
}

#define RUN(r, ...) run_ctl_v(r, NULL, NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_STDIN(r, path, ...) run_ctl_v(r, path, NULL, (const char *const[]){__VA_ARGS__, NULL})

/* Asserts the exit code, printing the run's output when it differs. */
static void expect_code(const run_t *r, int code) {
  if (r->code != code)
    fail_msg("wagmactl exited %d, wanted %d\n--- stdout:\n%s--- stderr:\n%s", r->code, code, r->out,
             r->err);
}

static void expect_has(const char *text, const char *what) {
  if (!strstr(text, what))
    fail_msg("expected '%s' in:\n%s", what, text);
}

/* The line of text that contains what (copied into buf), failing when there is none. */
static const char *line_with(const char *text, const char *what, char *buf, size_t len) {
  const char *p = strstr(text, what);
  if (!p)
    fail_msg("no line with '%s' in:\n%s", what, text);
  const char *start = p;
  while (start > text && start[-1] != '\n')
    start--;
  size_t l = strcspn(start, "\n");
  if (l >= len)
    l = len - 1;
  memcpy(buf, start, l);
  buf[l] = '\0';
  return buf;
}

static int column(const char *line, const char *word) {
  const char *p = strstr(line, word);
  return p ? (int)(p - line) : -1;
}

/* Runs "wagmactl --json ARGS" and parses stdout (exit 0 required). Caller decrefs. */
static json_t *json_of(const char *const *args) {
  const char *argv[16] = {"--json"};
  int n = 1;
  for (; args[n - 1] && n < 15; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;
  run_t r;
  run_ctl_v(&r, NULL, NULL, argv);
  expect_code(&r, 0);
  json_error_t je;
  json_t *v = json_loads(r.out, 0, &je);
  if (!v)
    fail_msg("--json output is not JSON (%s):\n%s", je.text, r.out);
  run_free(&r);
  return v;
}

#define JSON_OF(...) json_of((const char *const[]){__VA_ARGS__, NULL})

static void put_key(const char *key, const char *value) {
  assert_int_equal(wagma_etcd_put(C.kv, key, value, strlen(value), 0, NULL), 0);
}

static void write_spec(const char *name, const char *text, char *path, size_t len) {
  snprintf(path, len, "%s/%s.json", C.dir, name);
  write_file(path, text);
}

/* ---- the cluster ----------------------------------------------------------------------------- */

static int start_coordinator(void) {
  const char *const extra[] = {"--token-file", C.token_file, NULL};
  const char *const env[] = {"WAGMA_TOKEN", NULL};
  coordinator_options_t o = {.bin = WAGMA_COORDINATOR_BIN,
                             .endpoints = etcd_fixture_endpoints(C.etcd),
                             .id = "ctl-test",
                             .lease_ttl = 2,
                             .log = C.coord_log,
                             .extra = extra,
                             .env = env};
  if (coordinator_process_start(&o, &C.coord) != 0)
    return -1;
  snprintf(C.server, sizeof C.server, "%s", C.coord.base);
  return 0;
}

static void stop_coordinator(void) {
  coordinator_process_stop(&C.coord, SIGTERM);
}

static int teardown(void **state);

static int setup(void **state) {
  memset(&C, 0, sizeof C);
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(C.dir, sizeof C.dir, "%s/wagmactl-test-XXXXXX", tmp);
  if (!mkdtemp(C.dir))
    return -1;
  snprintf(C.token_file, sizeof C.token_file, "%s/token", C.dir);
  snprintf(C.coord_log, sizeof C.coord_log, "%s/coordinator.log", C.dir);
  write_file(C.token_file, TOKEN "\n");
  wagma_etcd_options_t o = {0};
  if (etcd_fixture_start(1, &C.etcd) != 0)
    goto fail;
  o.endpoints = etcd_fixture_endpoints(C.etcd);
  if (wagma_etcd_open(&o, &C.kv) != 0 || start_coordinator() != 0)
    goto fail;
  return 0;
fail: /* cmocka skips the group teardown when setup fails: stop what started, remove the dir */
  teardown(state);
  return -1;
}

static int teardown(void **state) {
  (void)state;
  stop_coordinator();
  wagma_etcd_close(C.kv);
  etcd_fixture_stop(C.etcd);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", C.dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", C.dir);
  return 0;
}

/* ---- tests, in order ----------------------------------------------------------------------- */

static void test_help_and_usage(void **state) {
  (void)state;
  run_t r;
  RUN(&r, "--help");
  expect_code(&r, 0);
  expect_has(r.out, "Exit codes");
  expect_has(r.out, "groups ID [--iteration T]");
  run_free(&r);
  RUN(&r, "scale", "--help");
  expect_code(&r, 0);
  expect_has(r.out, "scale ID N");
  run_free(&r);
  RUN(&r, "help", "submit");
  expect_code(&r, 0);
  expect_has(r.out, "submit FILE.json");
  run_free(&r);
  run_ctl_v(&r, NULL, NULL, (const char *const[]){NULL}); /* no command */
  expect_code(&r, 2);
  expect_has(r.err, "usage:");
  run_free(&r);
  RUN(&r, "frobnicate");
  expect_code(&r, 2);
  expect_has(r.err, "unknown command");
  run_free(&r);
  RUN(&r, "scale", "job", "zero");
  expect_code(&r, 2);
  run_free(&r);
}

/* Also waits for the coordinator: health until it answers ready (exit 0), deadline 30 s. */
static void test_health(void **state) {
  (void)state;
  run_t r = {0};
  double end = proc_now() + 30;
  for (;;) {
    RUN(&r, "health");
    if (r.code == 0 || proc_now() > end)
      break;
    run_free(&r);
    proc_sleep(0.2);
  }
  if (r.code != 0) {
    char *log = read_file(C.coord_log);
    fail_msg("coordinator not ready (exit %d): %s\nlog:\n%s", r.code, r.err, log);
  }
  expect_has(r.out, "ready:        yes");
  expect_has(r.out, "id:           ctl-test");
  run_free(&r);
  RUN(&r, "health", "--live");
  expect_code(&r, 0);
  expect_has(r.out, "status:       ok");
  run_free(&r);
  json_t *h = JSON_OF("health");
  assert_true(json_is_true(json_object_get(h, "ready")));
  json_decref(h);
}

static void test_agents(void **state) {
  (void)state;
  for (int i = 0; i < NAGENTS; i++) {
    char key[64], val[200];
    snprintf(key, sizeof key, "/wagma/agents/agent-%d", i);
    snprintf(val, sizeof val,
             "{\"address\":\"127.0.0.1:%d\",\"device\":\"cpu\",\"capacity\":1,"
             "\"version\":\"ctl-test\",\"started\":1700000000}",
             7100 + i);
    put_key(key, val);
  }
  run_t r;
  RUN(&r, "agents");
  expect_code(&r, 0);
  char hdr[256], row[256];
  line_with(r.out, "NAME", hdr, sizeof hdr);
  for (int i = 0; i < NAGENTS; i++) {
    char name[32], addr[32];
    snprintf(name, sizeof name, "agent-%d", i);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", 7100 + i);
    line_with(r.out, name, row, sizeof row);
    assert_int_equal(column(row, name), 0);
    assert_int_equal(column(row, addr), column(hdr, "ADDRESS"));
    assert_int_equal(column(row, "ctl-test"), column(hdr, "VERSION"));
  }
  run_free(&r);
  json_t *a = JSON_OF("agents");
  assert_int_equal(json_array_size(json_object_get(a, "agents")), NAGENTS);
  json_decref(a);
}

static void test_submit(void **state) {
  (void)state;
  char good[256], bad[256], other[256], missing[256];
  write_spec(
      "good",
      "{\"name\":\"job-a\",\"workers\":4,\"min_workers\":2,\"max_workers\":8,\"group_size\":2,"
      "\"staleness_bound\":8,\"dataset\":\"synthetic\",\"iterations\":100000}",
      good, sizeof good);
  write_spec("bad", "{\"name\":\"job-bad\",\"workers\":2,\"optimizer\":{\"lr\":-1}}", bad,
             sizeof bad);
  write_spec("other", "{\"name\":\"job-b\",\"workers\":2,\"dataset\":\"synthetic\"}", other,
             sizeof other);
  snprintf(missing, sizeof missing, "%s/does-not-exist.json", C.dir);
  run_t r;

  /* no token, wrong token: 401 -> exit 1, nothing created */
  RUN(&r, "submit", good);
  expect_code(&r, 1);
  expect_has(r.err, "401 unauthorized");
  run_free(&r);
  RUN(&r, "--token", "wrong-token", "submit", good);
  expect_code(&r, 1);
  expect_has(r.err, "unauthorized");
  run_free(&r);

  /* valid, token from --token-file */
  RUN(&r, "--token-file", C.token_file, "submit", good);
  expect_code(&r, 0);
  expect_has(r.out, "job job-a submitted");
  expect_has(r.out, "workers 4 (min 2, max 8)");
  run_free(&r);

  /* the same again: 409 exists */
  RUN(&r, "--token", TOKEN, "submit", good);
  expect_code(&r, 1);
  expect_has(r.err, "409 exists");
  run_free(&r);

  /* invalid spec: 422 naming the field */
  RUN(&r, "--token", TOKEN, "submit", bad);
  expect_code(&r, 1);
  expect_has(r.err, "422 invalid_spec");
  expect_has(r.err, "(field: optimizer.lr)");
  run_free(&r);

  /* from stdin, --json: the server's Job unchanged */
  RUN_STDIN(&r, other, "--json", "--token", TOKEN, "submit", "-");
  expect_code(&r, 0);
  json_t *job = json_loads(r.out, 0, NULL);
  assert_non_null(job);
  assert_string_equal(json_string_value(json_object_get(job, "id")), "job-b");
  json_decref(job);
  run_free(&r);

  /* a file that is not there: usage error, no request */
  RUN(&r, "--token", TOKEN, "submit", missing);
  expect_code(&r, 2);
  expect_has(r.err, "cannot read");
  run_free(&r);
}

/* Waits until job's status.epoch >= 1 (a plan exists), deadline 30 s. */
static void wait_for_plan(const char *job) {
  double end = proc_now() + 30;
  for (;;) {
    json_t *j = JSON_OF("get", job);
    json_int_t epoch = json_integer_value(json_object_get(json_object_get(j, "status"), "epoch"));
    json_decref(j);
    if (epoch >= 1)
      return;
    if (proc_now() > end)
      fail_msg("job %s got no plan within 30 s", job);
    proc_sleep(0.2);
  }
}

static void test_list(void **state) {
  (void)state;
  wait_for_plan("job-a");
  run_t r;
  RUN(&r, "list");
  expect_code(&r, 0);
  char hdr[256], a[256], b[256];
  line_with(r.out, "ITERATION", hdr, sizeof hdr);
  line_with(r.out, "job-a", a, sizeof a);
  line_with(r.out, "job-b", b, sizeof b);
  assert_int_equal(column(hdr, "ID"), 0);
  assert_int_equal(column(a, "running"), column(hdr, "STATE"));
  assert_int_equal(column(a, "4/4"), column(hdr, "WORKERS"));
  /* job-b waits: every agent works for job-a */
  assert_int_equal(column(b, "pending"), column(hdr, "STATE"));
  assert_int_equal(column(b, "0/2"), column(hdr, "WORKERS"));
  run_free(&r);
  RUN(&r, "list", "--state", "pending");
  expect_code(&r, 0);
  expect_has(r.out, "job-b");
  assert_null(strstr(r.out, "job-a"));
  run_free(&r);
  json_t *l = JSON_OF("list");
  assert_int_equal(json_array_size(json_object_get(l, "jobs")), 2);
  json_decref(l);
}

static void test_get(void **state) {
  (void)state;
  put_key("/wagma/jobs/job-a/progress/agent-1",
          "{\"state\":\"running\",\"epoch\":1,\"iteration\":42,\"loss\":0.625,"
          "\"accuracy\":0.75,\"step_time\":0.0125,\"staleness\":3,\"time\":1700000100}");
  run_t r;
  RUN(&r, "get", "job-a");
  expect_code(&r, 0);
  expect_has(r.out, "job:          job-a");
  expect_has(r.out, "state:        running");
  expect_has(r.out, "workers:      4 of 4 (min 2, max 8)");
  expect_has(r.out, "wagma, group size 2, staleness bound 8");
  char hdr[256], row[256];
  line_with(r.out, "STALENESS", hdr, sizeof hdr);
  line_with(r.out, "agent-1", row, sizeof row);
  assert_int_equal(column(row, "agent-1"), column(hdr, "NAME"));
  assert_int_equal(column(row, "42"), column(hdr, "ITERATION"));
  assert_int_equal(column(row, "0.6250"), column(hdr, "LOSS"));
  assert_int_equal(column(row, "75.00%"), column(hdr, "ACCURACY"));
  assert_int_equal(column(row, "12.5ms"), column(hdr, "STEP_TIME"));
  for (int i = 0; i < NAGENTS; i++) {
    char name[32];
    snprintf(name, sizeof name, "agent-%d", i);
    expect_has(r.out, name);
  }
  run_free(&r);
  json_t *j = JSON_OF("get", "job-a");
  assert_int_equal(json_array_size(json_object_get(j, "members")), NAGENTS);
  json_decref(j);
}

/* Every member name appears in exactly one group of the output. */
static void expect_partition(const char *out) {
  for (int i = 0; i < NAGENTS; i++) {
    char name[32];
    snprintf(name, sizeof name, "agent-%d", i);
    const char *first = strstr(out, name);
    if (!first)
      fail_msg("%s in no group:\n%s", name, out);
    assert_null(strstr(first + 1, name));
  }
}

static void test_groups_and_plan(void **state) {
  (void)state;
  run_t r;
  RUN(&r, "groups", "job-a");
  expect_code(&r, 0);
  expect_has(r.out, "job job-a  epoch ");
  expect_has(r.out, "GROUP");
  expect_partition(r.out);
  run_free(&r);
  /* round 0: (0 + 1) mod 8 != 0 -> two groups of two */
  RUN(&r, "groups", "job-a", "--iteration", "0");
  expect_code(&r, 0);
  expect_has(r.out, "iteration 0  phase 0  kind group");
  expect_partition(r.out);
  json_t *g = JSON_OF("groups", "job-a", "--iteration", "0");
  json_t *groups = json_object_get(g, "groups");
  assert_int_equal(json_array_size(groups), 2);
  for (size_t i = 0; i < 2; i++) {
    char line[256];
    json_t *grp = json_array_get(groups, i);
    json_t *m0 = json_array_get(json_object_get(grp, "members"), 0);
    line_with(r.out, json_string_value(m0), line, sizeof line); /* one line per group */
    expect_has(line, json_string_value(json_array_get(json_object_get(grp, "members"), 1)));
  }
  json_decref(g);
  run_free(&r);
  /* round 7: (7 + 1) mod 8 == 0 -> global, one group of everyone */
  RUN(&r, "groups", "job-a", "--iteration", "7");
  expect_code(&r, 0);
  expect_has(r.out, "kind global");
  expect_has(r.out, "0,1,2,3");
  run_free(&r);

  RUN(&r, "plan", "job-a");
  expect_code(&r, 0);
  expect_has(r.out, "group size:   2");
  expect_has(r.out, "phases (");
  expect_has(r.out, "JOINER");
  run_free(&r);
  json_t *p = JSON_OF("plan", "job-a");
  assert_int_equal(json_array_size(json_object_get(p, "members")), NAGENTS);
  assert_true(json_array_size(json_object_get(p, "phases")) >= 1);
  json_decref(p);
}

static void test_scale(void **state) {
  (void)state;
  run_t r;
  RUN(&r, "scale", "job-a", "2");
  expect_code(&r, 1); /* no token */
  expect_has(r.err, "unauthorized");
  run_free(&r);
  RUN(&r, "--token", TOKEN, "scale", "job-a", "9"); /* above max_workers 8 */
  expect_code(&r, 1);
  expect_has(r.err, "422 invalid_patch");
  run_free(&r);
  RUN(&r, "--token", TOKEN, "scale", "job-a", "1"); /* below min_workers 2 */
  expect_code(&r, 1);
  expect_has(r.err, "(field: workers)");
  run_free(&r);
  /* growing beyond the free agents is accepted (the job grows as agents register) */
  RUN(&r, "--token", TOKEN, "scale", "job-a", "6");
  expect_code(&r, 0);
  expect_has(r.out, "workers 6 (min 2, max 8)");
  run_free(&r);
  RUN(&r, "--token", TOKEN, "scale", "job-a", "2");
  expect_code(&r, 0);
  expect_has(r.out, "job job-a scaled");
  expect_has(r.out, "workers 2");
  run_free(&r);
  json_t *j = JSON_OF("get", "job-a");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "spec"), "workers")), 2);
  json_decref(j);
}

static void test_not_found(void **state) {
  (void)state;
  const char *const cmds[][6] = {
      {"get", "no-such-job"},
      {"groups", "no-such-job"},
      {"plan", "no-such-job"},
      {"--token", TOKEN, "scale", "no-such-job", "3"},
      {"--token", TOKEN, "stop", "no-such-job"},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    run_t r;
    run_ctl_v(&r, NULL, NULL, cmds[i]);
    expect_code(&r, 4);
    expect_has(r.err, "404");
    assert_string_equal(r.out, "");
    run_free(&r);
  }
  /* an id that cannot exist is refused before any request */
  run_t r;
  RUN(&r, "get", "../etc");
  expect_code(&r, 2);
  run_free(&r);
}

static void test_stop(void **state) {
  (void)state;
  run_t r;
  RUN(&r, "stop", "job-b");
  expect_code(&r, 1); /* no token */
  run_free(&r);
  RUN(&r, "--token", TOKEN, "stop", "job-b");
  expect_code(&r, 0);
  expect_has(r.out, "job job-b stopped: state stopped");
  run_free(&r);
  RUN(&r, "--token", TOKEN, "stop", "job-b"); /* already finished: 409 */
  expect_code(&r, 1);
  expect_has(r.err, "409");
  run_free(&r);
  RUN(&r, "--token", TOKEN, "stop", "--purge", "job-a"); /* still running: 409 active */
  expect_code(&r, 1);
  expect_has(r.err, "409 active");
  run_free(&r);
  RUN(&r, "--token", TOKEN, "stop", "--purge", "job-b");
  expect_code(&r, 0);
  expect_has(r.out, "job job-b purged");
  run_free(&r);
  RUN(&r, "get", "job-b");
  expect_code(&r, 4);
  run_free(&r);
  RUN(&r, "--token", TOKEN, "stop", "job-a");
  expect_code(&r, 0);
  run_free(&r);
  json_t *j = JSON_OF("get", "job-a");
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "status"), "state")),
                      "stopped");
  json_decref(j);
}

static void test_unreachable(void **state) {
  (void)state;
  char server[64];
  snprintf(server, sizeof server, "%s", C.server);
  stop_coordinator();
  run_t r;
  RUN(&r, "list");
  expect_code(&r, 3);
  expect_has(r.err, "cannot reach");
  assert_true(r.secs < 5.0); /* refused, not waited for */
  run_free(&r);
  RUN(&r, "--token", TOKEN, "scale", "job-a", "3");
  expect_code(&r, 3);
  run_free(&r);

  /* a server that accepts connections and never answers: exit 3 at --timeout */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(fd, 8), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
  snprintf(server, sizeof server, "http://127.0.0.1:%d", ntohs(sa.sin_port));
  RUN(&r, "--server", server, "--timeout", "1", "agents");
  close(fd);
  expect_code(&r, 3);
  expect_has(r.err, "timed out");
  assert_true(r.secs >= 0.9 && r.secs < 15.0);
  run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_and_usage),
      cmocka_unit_test(test_health),
      cmocka_unit_test(test_agents),
      cmocka_unit_test(test_submit),
      cmocka_unit_test(test_list),
      cmocka_unit_test(test_get),
      cmocka_unit_test(test_groups_and_plan),
      cmocka_unit_test(test_scale),
      cmocka_unit_test(test_not_found),
      cmocka_unit_test(test_stop),
      cmocka_unit_test(test_unreachable),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
