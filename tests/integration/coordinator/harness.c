/* harness.c — see harness.h. Processes and HTTP come from tests/support (process.h,
 * coordinator_process.h, http_client.h): started with fork/exec, stopped by PID, each child
 * with PR_SET_PDEATHSIG so a crashed test leaves nothing running. */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "process.h"

#ifndef WAGMA_COORDINATOR_BIN
#error "WAGMA_COORDINATOR_BIN must be defined"
#endif

double harness_now(void) {
  return proc_now();
}

void harness_sleep(double s) {
  proc_sleep(s);
}

int harness_free_port(void) {
  int port = proc_free_port();
  assert_true(port > 0);
  return port;
}

void harness_coord_start(coord_proc_t *p, const char *endpoints, const char *id, int ttl,
                         const char *token, const char *const *extra) {
  char log[256], token_env[256];
  const char *const env[] = {token ? token_env : "WAGMA_TOKEN", NULL};
  const char *const *args = extra;
  const char *debug_extra[32] = {"--log-level", "debug"};
  int n = 2;
  for (int i = 0; args && args[i] && n < 31; i++)
    debug_extra[n++] = args[i];
  debug_extra[n] = NULL;
  snprintf(token_env, sizeof token_env, "WAGMA_TOKEN=%s", token ? token : "");
  snprintf(log, sizeof log, "%s/wagma-coord-%s-%d.log",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", id, (int)getpid());
  coordinator_options_t o = {.bin = WAGMA_COORDINATOR_BIN,
                             .endpoints = endpoints,
                             .id = id,
                             .lease_ttl = ttl,
                             .log = log,
                             .extra = debug_extra,
                             .env = env};
  assert_int_equal(coordinator_process_start(&o, p), 0);
  if (coordinator_process_wait_healthy(p, 10) != 0)
    fail_msg("coordinator did not become healthy (log %s)", p->log);
}

int harness_coord_refused(const char *endpoints, const char *const *env, char *out, size_t len) {
  char listen[64], log[256];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", harness_free_port());
  snprintf(log, sizeof log, "%s/wagma-coord-refused-%d.log",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  unlink(log);
  const char *const argv[] = {WAGMA_COORDINATOR_BIN, "--etcd", endpoints, "--listen", listen, NULL};
  pid_t pid = proc_spawn(argv, log, env);
  assert_true(pid > 0);
  int st = proc_wait(pid, 10);
  out[0] = '\0';
  FILE *f = fopen(log, "r");
  if (f) {
    size_t n = fread(out, 1, len - 1, f);
    out[n] = '\0';
    fclose(f);
  }
  unlink(log);
  return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Stops by PID and removes the log (kept when a test fails before stopping, or with
 * WAGMA_KEEP_LOGS set). */
void harness_coord_stop(coord_proc_t *p, int sig) {
  coordinator_process_stop(p, sig);
  if (p->log[0] && !getenv("WAGMA_KEEP_LOGS"))
    unlink(p->log);
}

int harness_env_start(harness_env_t **out) {
  harness_env_t *e = calloc(1, sizeof *e);
  *out = e;
  if (!e || etcd_fixture_start(1, &e->fx) != 0)
    return -1;
  wagma_etcd_options_t o = {.endpoints = etcd_fixture_endpoints(e->fx), .call_timeout_ms = 3000};
  if (wagma_etcd_open(&o, &e->etcd) != 0)
    return -1;
  return 0;
}

void harness_env_stop(harness_env_t *e) {
  if (!e)
    return;
  wagma_etcd_close(e->etcd);
  etcd_fixture_stop(e->fx);
  free(e);
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

void harness_http(const char *method, const char *url, const char *body, size_t body_len,
                  const char *content_type, const char *token, http_result_t *r) {
  http_request(method, url, body, body_len, content_type, token, r);
  assert_non_null(r->body);
}

void harness_http_free(http_result_t *r) {
  http_result_free(r);
}

json_t *harness_get_json(const char *url, long *status) {
  http_result_t r;
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  if (status)
    *status = r.status;
  json_t *v = json_loads(r.body, 0, NULL);
  harness_http_free(&r);
  return v;
}

/* ---- fake agents ----------------------------------------------------------------------- */

void harness_agent_start(wagma_etcd_t *etcd, fake_agent_t *a, const char *name, int port, int ttl) {
  char key[128], val[160];
  memset(a, 0, sizeof *a);
  snprintf(a->name, sizeof a->name, "%s", name);
  assert_int_equal(wagma_etcd_lease_grant(etcd, ttl, &a->lease), 0);
  snprintf(key, sizeof key, "/wagma/agents/%s", name);
  snprintf(val, sizeof val,
           "{\"address\":\"127.0.0.1:%d\",\"device\":\"cpu\",\"capacity\":1,"
           "\"version\":\"test\",\"started\":1700000000}",
           port);
  assert_int_equal(wagma_etcd_put(etcd, key, val, strlen(val), a->lease, NULL), 0);
  assert_int_equal(wagma_etcd_keepalive_start(etcd, a->lease, NULL, NULL, &a->ka), 0);
}

void harness_agent_freeze(fake_agent_t *a) {
  wagma_etcd_keepalive_stop(a->ka);
  a->ka = NULL;
}

void harness_agent_kill(wagma_etcd_t *etcd, fake_agent_t *a) {
  harness_agent_freeze(a);
  if (a->lease)
    wagma_etcd_lease_revoke(etcd, a->lease);
  a->lease = 0;
}

/* The epoch of the job's status (0 without one). */
static uint64_t status_epoch(wagma_etcd_t *etcd, const char *job) {
  char key[192];
  wagma_etcd_kv_t *kv = NULL;
  uint64_t epoch = 0;
  snprintf(key, sizeof key, "/wagma/jobs/%s/status", job);
  if (wagma_etcd_get(etcd, key, &kv, NULL) == 0) {
    json_t *st = json_loadb(kv->value, kv->value_len, 0, NULL);
    json_t *e = json_object_get(st, "epoch");
    epoch = json_is_integer(e) && json_integer_value(e) > 0 ? (uint64_t)json_integer_value(e) : 0;
    json_decref(st);
    wagma_etcd_kv_free(kv);
  }
  return epoch;
}

void harness_progress(wagma_etcd_t *etcd, const char *job, const char *agent, uint64_t iteration,
                      const char *state, double loss) {
  harness_progress_epoch(etcd, job, agent, status_epoch(etcd, job), iteration, state, loss);
}

void harness_progress_epoch(wagma_etcd_t *etcd, const char *job, const char *agent, uint64_t epoch,
                            uint64_t iteration, const char *state, double loss) {
  char key[192], val[320];
  snprintf(key, sizeof key, "/wagma/jobs/%s/progress/%s", job, agent);
  snprintf(val, sizeof val,
           "{\"state\":\"%s\",\"epoch\":%llu,\"iteration\":%llu,\"loss\":%g,"
           "\"accuracy\":null,\"step_time\":0.01,\"staleness\":1,\"rounds_activated\":3,"
           "\"rounds_joined\":4}",
           state, (unsigned long long)epoch, (unsigned long long)iteration, loss);
  assert_int_equal(wagma_etcd_put(etcd, key, val, strlen(val), 0, NULL), 0);
}

/* ---- job polling --------------------------------------------------------------------------- */

static json_t *get_job(const char *base, const char *job) {
  char url[256];
  snprintf(url, sizeof url, "%s/v1/jobs/%s", base, job);
  long st = 0;
  json_t *v = harness_get_json(url, &st);
  if (st != 200) {
    json_decref(v);
    return NULL;
  }
  return v;
}

long long harness_job_epoch(const char *base, const char *job) {
  json_t *v = get_job(base, job);
  long long e = v ? json_integer_value(json_object_get(json_object_get(v, "status"), "epoch")) : -1;
  json_decref(v);
  return e;
}

const char *harness_job_state(const char *base, const char *job, char *buf, size_t len) {
  json_t *v = get_job(base, job);
  const char *s =
      v ? json_string_value(json_object_get(json_object_get(v, "status"), "state")) : NULL;
  snprintf(buf, len, "%s", s ? s : "");
  json_decref(v);
  return buf;
}

double harness_wait_epoch(const char *base, const char *job, long long epoch, double timeout) {
  double t0 = harness_now();
  while (harness_now() - t0 < timeout) {
    if (harness_job_epoch(base, job) >= epoch)
      return harness_now() - t0;
    harness_sleep(0.05);
  }
  return -1;
}

double harness_wait_state(const char *base, const char *job, const char *state, double timeout) {
  double t0 = harness_now();
  char buf[32];
  while (harness_now() - t0 < timeout) {
    if (strcmp(harness_job_state(base, job, buf, sizeof buf), state) == 0)
      return harness_now() - t0;
    harness_sleep(0.05);
  }
  return -1;
}

int harness_group_setup(void **state) {
  harness_env_t *e = NULL;
  int rc = harness_env_start(&e);
  *state = e;
  return rc;
}

int harness_group_teardown(void **state) {
  harness_env_stop(*state);
  return 0;
}
