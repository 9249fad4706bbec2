/* etcd_fixture.h — a real etcd for integration tests (CMake target wagma_test_etcd_fixture).
 *
 * Starts Debian's /usr/bin/etcd (override with $WAGMA_ETCD_BIN) on 127.0.0.1 only, with
 * free client and peer ports and a private data dir under $TMPDIR (default /tmp), one
 * process per member. Everything it starts it stops BY PID; the data dirs are removed.
 * Children get PR_SET_PDEATHSIG(SIGKILL), so a crashed test leaves no etcd behind.
 * Each member's log goes to <data dir>/../<member>.log (printed on a failed start).
 *
 *   etcd_fixture_t *etcd;
 *   assert_int_equal(etcd_fixture_start(1, &etcd), 0);
 *   ... wagma_etcd_open(&(wagma_etcd_options_t){.endpoints = etcd_fixture_endpoints(etcd)}, ...)
 *   etcd_fixture_kill(etcd, 0);      // SIGKILL member 0 (calls now fail)
 *   etcd_fixture_restart(etcd, 0);   // same ports, same data dir, waits until healthy
 *   etcd_fixture_stop(etcd);
 *
 * Not thread-safe: drive a fixture from one thread. Functions return 0 or -1 (with a
 * message on stderr: this is test code). */
#ifndef WAGMA_TEST_ETCD_FIXTURE_H
#define WAGMA_TEST_ETCD_FIXTURE_H

#include <sys/types.h>

#define ETCD_FIXTURE_MAX_MEMBERS 5
#define ETCD_FIXTURE_START_TIMEOUT_MS 20000

typedef struct etcd_fixture etcd_fixture_t;

/* Starts a cluster of `members` (1..5; 1 = single node, 3 = the usual cluster) and waits
 * until every member answers /health (deadline ETCD_FIXTURE_START_TIMEOUT_MS). */
int etcd_fixture_start(int members, etcd_fixture_t **out);

/* More settings of a fixture (etcd_fixture_start_with). Strings are copied. */
typedef struct etcd_fixture_options {
  /* TLS on the client port (https://): etcd's certificate and key (PEM). Health is then
   * read over plain HTTP from a --listen-metrics-urls port. */
  const char *cert_file, *key_file;
  const char *trusted_ca_file; /* with client_cert_auth: clients need a cert it signed */
  int client_cert_auth;
  const char *extra_args[8]; /* more etcd flags, one per entry, e.g. "--auth-token-ttl=2" */
  const char *etcdctl_args;  /* added to every etcd_fixture_etcdctl command */
  /* an IPv4 address of this host (a veth of a test's own network namespace) where the client
   * port listens too, beside 127.0.0.1; its endpoint: etcd_fixture_endpoint_on */
  const char *extra_client_host;
} etcd_fixture_options_t;

/* As etcd_fixture_start, with options (may be NULL). */
int etcd_fixture_start_with(int members, const etcd_fixture_options_t *options,
                            etcd_fixture_t **out);

/* Replaces the flags added to etcdctl commands (e.g. "--user=root:pw" once auth is on). */
void etcd_fixture_set_etcdctl_args(etcd_fixture_t *fixture, const char *args);

/* Kills every member still running (SIGKILL, by PID, reaped), removes the data dir and
 * frees. NULL is a no-op. */
void etcd_fixture_stop(etcd_fixture_t *fixture);

/* "127.0.0.1:<client port>,..." of every member (running or not). Valid until stop. */
const char *etcd_fixture_endpoints(const etcd_fixture_t *fixture);

/* "127.0.0.1:<client port>" of one member. */
const char *etcd_fixture_endpoint(const etcd_fixture_t *fixture, int member);
/* "<extra_client_host>:<client port>,..." of every member, or NULL without an extra host.
 * Valid until stop. */
const char *etcd_fixture_endpoints_on_extra_host(const etcd_fixture_t *fixture);

int etcd_fixture_members(const etcd_fixture_t *fixture);

/* PID of a member, or 0 when it is not running. */
pid_t etcd_fixture_pid(const etcd_fixture_t *fixture, int member);

/* SIGKILL one member and reap it. Its data dir and ports are kept. */
int etcd_fixture_kill(etcd_fixture_t *fixture, int member);

/* Starts a killed member again on the same data dir and ports; waits until healthy.
 * (For a cluster, health needs a quorum of members running.) */
int etcd_fixture_restart(etcd_fixture_t *fixture, int member);

/* Waits until member answers /health with "true", up to timeout_ms. */
int etcd_fixture_wait_healthy(etcd_fixture_t *fixture, int member, int timeout_ms);

/* Runs `etcdctl --endpoints=<all> <args>` (ETCDCTL_API=3) through /bin/sh; args must be
 * shell-safe. Output goes to the test's stderr. Returns etcdctl's exit status (or -1). */
int etcd_fixture_etcdctl(const etcd_fixture_t *fixture, const char *args);

#endif
