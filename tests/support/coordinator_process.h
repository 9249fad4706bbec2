/* coordinator_process.h — one wagma-coordinator process for integration tests (CMake target
 * wagma_test_coordinator_process, on top of process.h): listens on a free 127.0.0.1 port,
 * talks to an etcd (e.g. tests/support/etcd_fixture), logs to a file, stopped BY PID.
 *
 *   coordinator_process_t c;
 *   coordinator_options_t o = {.endpoints = etcd_fixture_endpoints(etcd), .lease_ttl = 3,
 *                              .log = "/tmp/dir/coordinator.log"};
 *   if (coordinator_process_start(&o, &c) != 0 || coordinator_process_wait_healthy(&c, 10) != 0)
 *     ...
 *   ... c.base is "http://127.0.0.1:<port>" ...
 *   coordinator_process_stop(&c, SIGTERM);
 *
 * Functions return 0 / -1 and never abort (test code asserts). */
#ifndef WAGMA_TEST_COORDINATOR_PROCESS_H
#define WAGMA_TEST_COORDINATOR_PROCESS_H

#include <sys/types.h>

typedef struct coordinator_options {
  const char *bin;          /* NULL = $WAGMA_COORDINATOR_BIN */
  const char *endpoints;    /* --etcd */
  const char *id;           /* --id; NULL = none */
  int lease_ttl;            /* --lease-ttl; 0 = none */
  const char *log;          /* stdout + stderr, appended (NULL = inherited) */
  const char *const *extra; /* more flags (NULL-terminated, may be NULL) */
  const char *const *env;   /* child environment edits, as proc_spawn (may be NULL) */
} coordinator_options_t;

typedef struct coordinator_process {
  pid_t pid; /* 0 when not running */
  int port;
  char base[64]; /* "http://127.0.0.1:<port>" */
  char log[256];
} coordinator_process_t;

/* Picks a free port and spawns the coordinator with --etcd --listen 127.0.0.1:<port> [--id]
 * [--lease-ttl] and the extra flags. Does not wait for it. */
int coordinator_process_start(const coordinator_options_t *o, coordinator_process_t *p);

/* Polls GET /healthz until it answers 200 (0), timeout_s passes or the process exits (-1;
 * then p->pid becomes 0). */
int coordinator_process_wait_healthy(coordinator_process_t *p, double timeout_s);

/* Sends sig (SIGTERM, SIGKILL, ...), SIGKILL after 10 s; reaps; p->pid becomes 0. */
void coordinator_process_stop(coordinator_process_t *p, int sig);

#endif
