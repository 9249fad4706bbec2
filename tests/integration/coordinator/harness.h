/* harness.h — helpers of the coordinator integration tests: start / stop wagma-coordinator
 * processes (by PID), HTTP calls through libcurl, fake agents (leased registration keys
 * written with the etcd client), and polling with deadlines. Test code: failures abort the
 * test through cmocka. */
#ifndef WAGMA_TEST_COORD_HARNESS_H
#define WAGMA_TEST_COORD_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "coordinator_process.h"
#include "etcd_fixture.h"
#include "http_client.h"
#include "wagma/etcd.h"

/* pid, port, base "http://127.0.0.1:<port>", log (tests/support/coordinator_process.h). */
typedef coordinator_process_t coord_proc_t;

int harness_free_port(void);

/* Starts wagma-coordinator with --etcd endpoints --listen 127.0.0.1:<free port> --id id
 * --lease-ttl ttl plus extra (NULL-terminated argv, may be NULL); env token (may be NULL)
 * becomes WAGMA_TOKEN. Waits until /healthz answers (10 s). */
void harness_coord_start(coord_proc_t *p, const char *endpoints, const char *id, int ttl,
                         const char *token, const char *const *extra);
/* Runs wagma-coordinator --etcd endpoints --listen 127.0.0.1:<free port> with env (as
 * proc_spawn takes it) and expects it to exit by itself within 10 s (a refused start):
 * returns its exit status (-1 when it did not exit) and its output in out (NUL-terminated). */
int harness_coord_refused(const char *endpoints, const char *const *env, char *out, size_t len);
/* Sends sig (SIGTERM or SIGKILL), reaps (SIGKILL after 10 s), removes the log unless
 * WAGMA_KEEP_LOGS is set. */
void harness_coord_stop(coord_proc_t *p, int sig);

/* One request (tests/support/http_client.h; asserts that curl got a handle). body may be NULL;
 * content_type NULL = none; token NULL = no Authorization. */
void harness_http(const char *method, const char *url, const char *body, size_t body_len,
                  const char *content_type, const char *token, http_result_t *r);
void harness_http_free(http_result_t *r);
/* GET url and parse the JSON body (NULL if not JSON). Ownership: caller decrefs. */
json_t *harness_get_json(const char *url, long *status);

/* A fake agent: a leased key <prefix>/agents/<name>. */
typedef struct fake_agent {
  char name[64];
  int64_t lease;
  wagma_etcd_keepalive_t *ka;
} fake_agent_t;

void harness_agent_start(wagma_etcd_t *etcd, fake_agent_t *a, const char *name, int port, int ttl);
/* Stops refreshing: the lease expires after its TTL. */
void harness_agent_freeze(fake_agent_t *a);
/* Stops refreshing and revokes (the key disappears at once). */
void harness_agent_kill(wagma_etcd_t *etcd, fake_agent_t *a);
/* Writes a progress record of the job's current epoch (read from its status), as a member
 * of the current plan reports; harness_progress_epoch names the epoch. */
void harness_progress(wagma_etcd_t *etcd, const char *job, const char *agent, uint64_t iteration,
                      const char *state, double loss);
void harness_progress_epoch(wagma_etcd_t *etcd, const char *job, const char *agent, uint64_t epoch,
                            uint64_t iteration, const char *state, double loss);

/* One etcd (tests/support fixture) and a client on it (call timeout 3 s). */
typedef struct harness_env {
  etcd_fixture_t *fx;
  wagma_etcd_t *etcd;
} harness_env_t;

/* Starts both; 0 or -1 (a half-started env is still returned in *out for harness_env_stop).
 * Ownership: the caller stops *out with harness_env_stop. */
int harness_env_start(harness_env_t **out);
/* Closes the client, stops etcd, frees. NULL is a no-op. */
void harness_env_stop(harness_env_t *e);
/* cmocka group setup / teardown: *state becomes a started env (harness_env_start). */
int harness_group_setup(void **state);
int harness_group_teardown(void **state);

double harness_now(void);
void harness_sleep(double seconds);

/* Job state accessors on GET /v1/jobs/<id>; -1 / "" when unavailable. */
long long harness_job_epoch(const char *base, const char *job);
const char *harness_job_state(const char *base, const char *job, char *buf, size_t len);
/* Waits until the job's epoch >= epoch; returns the seconds it took or -1 on timeout. */
double harness_wait_epoch(const char *base, const char *job, long long epoch, double timeout);
double harness_wait_state(const char *base, const char *job, const char *state, double timeout);

#endif
