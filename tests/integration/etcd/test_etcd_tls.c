/* Integration tests of libwagma_etcd against an etcd with TLS, client-certificate auth and
 * etcd users (a root user, and a user "wagma" whose role may read and write /wagma/ only).
 *
 * The certificates are made for the run with the openssl CLI in a temp dir: a CA, etcd's
 * server certificate (IP 127.0.0.1), a client certificate with CN "wagma", and a second,
 * unrelated CA. etcd runs with --auth-token-ttl=2, so a token left unused for 2 s expires.
 * Checked: the right CA, client certificate and password work (KV, watch, lease), and the
 * role is enforced; a wrong CA, a missing client certificate and a wrong password fail with a
 * clear message well within the call deadline; an expired token and an etcd restart (simple
 * tokens live in memory) are each renewed transparently, a running watch included; a password
 * rotated in etcd and in the password file is picked up; so are a new CA and client pair
 * written over the handle's TLS files (etcd moved to a new CA), a running watch included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "etcd_fixture.h"
#include "recorder.h"
#include "tls_etcd.h"
#include "wagma/etcd.h"

#define CALL_TIMEOUT_MS 3000
#define TOKEN_TTL_S 2

static tls_etcd_t g_tls;
static etcd_fixture_t *g_etcd;
static int g_rejections; /* "token rejected" log lines of the library */
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;

static void test_log(void *user, int level, const char *message) {
  (void)user;
  pthread_mutex_lock(&g_log_lock);
  if (strstr(message, "token rejected") != NULL)
    g_rejections++;
  pthread_mutex_unlock(&g_log_lock);
  if (getenv("WAGMA_TEST_ETCD_LOG") != NULL)
    fprintf(stderr, "[%lld] etcd log %d: %s\n", (long long)test_now_ms(), level, message);
}

static int rejections(void) {
  pthread_mutex_lock(&g_log_lock);
  int n = g_rejections;
  pthread_mutex_unlock(&g_log_lock);
  return n;
}

static const char *path(const char *name) {
  return tls_etcd_path(&g_tls, name);
}

static void write_file(const char *name, const char *text) {
  assert_int_equal(tls_etcd_write(&g_tls, name, text), 0);
}

static int setup(void **state) {
  (void)state;
  char ttl[64];
  snprintf(ttl, sizeof ttl, "--auth-token-ttl=%d", TOKEN_TTL_S);
  if (tls_etcd_start(&g_tls, (const char *const[]){ttl, NULL}) != 0)
    return -1;
  g_etcd = g_tls.etcd;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tls_etcd_stop(&g_tls);
  return 0;
}

/* The usual options: right CA, client pair, user wagma with the password file. */
static wagma_etcd_options_t good_options(void) {
  wagma_etcd_options_t o = {.endpoints = etcd_fixture_endpoints(g_etcd),
                            .call_timeout_ms = CALL_TIMEOUT_MS,
                            .log_fn = test_log,
                            .ca_file = path("ca.crt"),
                            .cert_file = path("client.crt"),
                            .key_file = path("client.key"),
                            .username = "wagma",
                            .password_file = path("password"),
                            .ping_key = "/wagma/"};
  return o;
}

static wagma_etcd_t *open_good(void) {
  wagma_etcd_options_t o = good_options();
  wagma_etcd_t *etcd = NULL;
  assert_int_equal(wagma_etcd_open(&o, &etcd), 0);
  return etcd;
}

static void put_ok(wagma_etcd_t *etcd, const char *key, const char *value) {
  int rc = wagma_etcd_put(etcd, key, value, strlen(value), 0, NULL);
  if (rc != 0)
    fail_msg("put %s: %s: %s", key, wagma_strerror(rc), wagma_etcd_errmsg(etcd));
}

static void tls_and_user_work(void **state) {
  (void)state;
  wagma_etcd_t *etcd = open_good();
  wagma_etcd_kv_t *kv = NULL;
  int64_t lease = 0, ttl = 0;
  recorder_t rec;
  wagma_etcd_watch_t *watch = NULL;
  recorder_init(&rec);
  assert_int_equal(wagma_etcd_ping(etcd, NULL), 0);
  put_ok(etcd, "/wagma/tls/a", "1");
  assert_int_equal(wagma_etcd_get(etcd, "/wagma/tls/a", &kv, NULL), 0);
  assert_string_equal(kv->value, "1");
  wagma_etcd_kv_free(kv);
  assert_int_equal(wagma_etcd_watch_start(etcd, "/wagma/tls/",
                                          &(wagma_etcd_watch_options_t){.prefix = 1},
                                          recorder_watch_fn, &rec, &watch),
                   0);
  put_ok(etcd, "/wagma/tls/b", "2");
  assert_int_equal(recorder_wait_events(&rec, 1, 5000), 1);
  assert_int_equal(wagma_etcd_lease_grant(etcd, 10, &lease), 0);
  assert_int_equal(wagma_etcd_lease_keepalive_once(etcd, lease, &ttl), 0);
  assert_true(ttl > 0);
  /* The role is enforced: the user may not write outside /wagma/. */
  assert_int_equal(wagma_etcd_put(etcd, "/elsewhere", "x", 1, 0, NULL), WAGMA_EPERM);
  assert_non_null(strstr(wagma_etcd_errmsg(etcd), "permission denied"));
  wagma_etcd_watch_stop(watch);
  wagma_etcd_close(etcd);
  recorder_destroy(&rec);
}

/* Opens with o, pings once: returns the status, checks it came within the deadline. */
static int ping_once(wagma_etcd_options_t *o, char *detail, size_t len) {
  wagma_etcd_t *etcd = NULL;
  assert_int_equal(wagma_etcd_open(o, &etcd), 0);
  int64_t t0 = test_now_ms();
  int rc = wagma_etcd_ping(etcd, NULL);
  int64_t took = test_now_ms() - t0;
  snprintf(detail, len, "%s", wagma_etcd_errmsg(etcd));
  fprintf(stderr, "ping: %s after %lld ms: %s\n", wagma_strerror(rc), (long long)took, detail);
  assert_true(took <= CALL_TIMEOUT_MS + 1000);
  wagma_etcd_close(etcd);
  return rc;
}

static void wrong_ca_fails_fast_and_says_tls(void **state) {
  (void)state;
  wagma_etcd_options_t o = good_options();
  char detail[600];
  o.ca_file = path("other-ca.crt");
  assert_int_equal(ping_once(&o, detail, sizeof detail), WAGMA_EPERM);
  assert_non_null(strstr(detail, "TLS handshake"));
}

static void missing_client_cert_fails_fast(void **state) {
  (void)state;
  wagma_etcd_options_t o = good_options();
  char detail[600];
  o.cert_file = o.key_file = NULL;
  int rc = ping_once(&o, detail, sizeof detail);
  /* TLS 1.3: the client's handshake ends before etcd checks its certificate, so etcd's
   * refusal arrives as a broken connection, not a handshake error. */
  assert_int_equal(rc, WAGMA_EUNAVAIL);
  assert_non_null(strstr(detail, "client certificate"));
}

static void plain_client_is_refused(void **state) {
  (void)state;
  wagma_etcd_options_t o = {.endpoints = etcd_fixture_endpoints(g_etcd),
                            .call_timeout_ms = CALL_TIMEOUT_MS};
  char detail[600];
  assert_int_not_equal(ping_once(&o, detail, sizeof detail), 0);
}

static void wrong_password_says_so(void **state) {
  (void)state;
  wagma_etcd_options_t o = good_options();
  char detail[600];
  o.password_file = NULL;
  o.password = "not-the-password";
  assert_int_equal(ping_once(&o, detail, sizeof detail), WAGMA_EPERM);
  assert_non_null(strstr(detail, "authentication failed"));
  assert_non_null(strstr(detail, "wagma"));
}

static void bad_options_are_refused_at_open(void **state) {
  (void)state;
  wagma_etcd_options_t o = good_options();
  wagma_etcd_t *etcd = NULL;
  char why[256];
  o.key_file = NULL;
  assert_int_equal(wagma_etcd_options_check(&o, why, sizeof why), WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_open(&o, &etcd), WAGMA_EINVAL);
  o = good_options();
  o.ca_file = path("no-such.crt");
  assert_int_equal(wagma_etcd_options_check(&o, why, sizeof why), WAGMA_EINVAL);
  assert_non_null(strstr(why, "no-such.crt"));
  o = good_options();
  o.password_file = NULL;
  assert_int_equal(wagma_etcd_options_check(&o, why, sizeof why), WAGMA_EINVAL);
  o = good_options();
  o.endpoints = "http://127.0.0.1:2379";
  assert_int_equal(wagma_etcd_options_check(&o, why, sizeof why), WAGMA_EINVAL);
  o.endpoints = "https://127.0.0.1:2379,http://127.0.0.1:2380";
  assert_int_equal(wagma_etcd_options_check(&o, why, sizeof why), WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_options_check(&(wagma_etcd_options_t){.endpoints = "https://h:1"},
                                            why, sizeof why),
                   0);
}

/* With --client-cert-auth and no user, etcd takes the certificate's CN (wagma) as the user. */
static void certificate_cn_is_the_user(void **state) {
  (void)state;
  wagma_etcd_options_t o = good_options();
  wagma_etcd_t *etcd = NULL;
  o.username = NULL;
  o.password_file = NULL;
  assert_int_equal(wagma_etcd_open(&o, &etcd), 0);
  put_ok(etcd, "/wagma/tls/cn", "1");
  assert_int_equal(wagma_etcd_put(etcd, "/elsewhere", "x", 1, 0, NULL), WAGMA_EPERM);
  wagma_etcd_close(etcd);
}

/* Tokens expire when unused for --auth-token-ttl: the next call authenticates again and
 * carries on. A watch whose stream breaks after its token expired (etcd restarted: the
 * tokens themselves survive, etcd replays Authenticate from its log) is refused with
 * "permission denied" on its new stream and renews the token too, missing nothing. */
static void rejected_tokens_are_renewed(void **state) {
  (void)state;
  wagma_etcd_t *etcd = open_good(), *writer = open_good();
  recorder_t rec;
  wagma_etcd_watch_t *watch = NULL;
  int before;
  recorder_init(&rec);
  assert_int_equal(wagma_etcd_watch_start(etcd, "/wagma/renew/",
                                          &(wagma_etcd_watch_options_t){.prefix = 1},
                                          recorder_watch_fn, &rec, &watch),
                   0);
  put_ok(etcd, "/wagma/renew/0", "fresh");

  before = rejections();
  test_sleep_ms((TOKEN_TTL_S + 2) * 1000); /* expired by etcd's TTL */
  put_ok(etcd, "/wagma/renew/1", "after-ttl");
  assert_true(rejections() > before);
  assert_int_equal(recorder_wait_events(&rec, 2, 5000), 2);

  /* The watch's token expires; then its stream breaks. */
  test_sleep_ms((TOKEN_TTL_S + 2) * 1000);
  before = rejections();
  assert_int_equal(etcd_fixture_kill(g_etcd, 0), 0);
  assert_int_equal(etcd_fixture_restart(g_etcd, 0), 0);
  int64_t t0 = test_now_ms();
  int rc;
  while ((rc = wagma_etcd_put(writer, "/wagma/renew/2", "after-restart", 13, 0, NULL)) != 0) {
    assert_int_not_equal(rc, WAGMA_EPERM);
    assert_true(test_now_ms() - t0 < 15000);
    test_sleep_ms(100);
  }
  assert_int_equal(recorder_wait_events(&rec, 3, 15000), 3);
  pthread_mutex_lock(&rec.lock);
  assert_string_equal(rec.events[2].value, "after-restart");
  pthread_mutex_unlock(&rec.lock);
  assert_true(rejections() > before);
  wagma_etcd_watch_stop(watch);
  wagma_etcd_close(writer);
  wagma_etcd_close(etcd);
  recorder_destroy(&rec);
}

/* The password changes in etcd (every token goes stale): a handle whose file still has the
 * old one gets a clear error; once the file has the new one, the same handle works. */
static void rotated_password_is_read_again(void **state) {
  (void)state;
  wagma_etcd_t *etcd = open_good();
  put_ok(etcd, "/wagma/rotate", "1");
  assert_int_equal(etcd_fixture_etcdctl(g_etcd, "user passwd wagma --interactive=false <<EOF\n"
                                                "newpw\nEOF"),
                   0);
  int rc = wagma_etcd_put(etcd, "/wagma/rotate", "2", 1, 0, NULL);
  assert_int_equal(rc, WAGMA_EPERM);
  assert_non_null(strstr(wagma_etcd_errmsg(etcd), "authentication failed"));
  write_file("password", "newpw\n");
  put_ok(etcd, "/wagma/rotate", "3");
  wagma_etcd_close(etcd);
}

static int g_tls_reloads; /* "TLS files changed: new connections" log lines */

static void rotation_log(void *user, int level, const char *message) {
  if (strstr(message, "TLS files changed: new connections") != NULL) {
    pthread_mutex_lock(&g_log_lock);
    g_tls_reloads++;
    pthread_mutex_unlock(&g_log_lock);
  }
  test_log(user, level, message);
}

/* Replaces dir/name with the content of dir/from the way Kubernetes updates a mounted
 * Secret: written beside it, then renamed over it (one atomic step for a reader). */
static void replace_file(const char *name, const char *from) {
  assert_int_equal(tls_etcd_sh("cd '%s' && cp %s .%s.new && mv -f .%s.new %s", g_tls.dir, from,
                               name, name, name),
                   0);
}

/* Certificate rotation without a restart. The handle reads its CA and client pair from
 * files of its own. etcd then moves to a new CA (its server certificate and the client CAs
 * it trusts), and restarts, so the open connections go: the handle, still on the old CA,
 * cannot connect (the handshake fails). Once the files hold the new CA and a client pair it
 * signed, the same handle, and the watch it had open, work again within a few seconds. Runs
 * last: etcd keeps the new certificates. */
static void rotated_certificates_are_read_again(void **state) {
  (void)state;
  assert_int_equal(tls_etcd_sh("cd '%s' && cp ca.crt my-ca.crt && cp client.crt my-client.crt && "
                               "cp client.key my-client.key",
                               g_tls.dir),
                   0);
  wagma_etcd_options_t o = good_options();
  o.ca_file = path("my-ca.crt");
  o.cert_file = path("my-client.crt");
  o.key_file = path("my-client.key");
  o.log_fn = rotation_log;
  wagma_etcd_t *etcd = NULL;
  assert_int_equal(wagma_etcd_open(&o, &etcd), 0);
  put_ok(etcd, "/wagma/rot/before", "1");
  recorder_t rec;
  recorder_init(&rec);
  wagma_etcd_watch_t *watch = NULL;
  assert_int_equal(wagma_etcd_watch_start(etcd, "/wagma/rot/",
                                          &(wagma_etcd_watch_options_t){.prefix = 1},
                                          recorder_watch_fn, &rec, &watch),
                   0);

  /* A second CA, etcd's certificate and a client pair signed by it. */
  const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  assert_int_equal(
      tls_etcd_sh("cd '%s' && openssl req -x509 %s -keyout ca2.key -out ca2.crt -days 2"
                  " -subj /CN=wagma-test-ca-2 2>/dev/null"
                  " && openssl req %s -keyout server2.key -out server2.csr -subj /CN=etcd"
                  " 2>/dev/null && openssl x509 -req -in server2.csr -CA ca2.crt -CAkey ca2.key"
                  " -CAcreateserial -out server2.crt -days 2 -extfile server.ext 2>/dev/null"
                  " && openssl req %s -keyout client2.key -out client2.csr -subj /CN=wagma"
                  " 2>/dev/null && openssl x509 -req -in client2.csr -CA ca2.crt -CAkey ca2.key"
                  " -CAcreateserial -out client2.crt -days 2 -extfile client.ext 2>/dev/null"
                  " && cat ca.crt ca2.crt > both-cas.crt",
                  g_tls.dir, ec, ec, ec),
      0);
  /* etcd moves to the new CA (it trusts both for clients: etcdctl keeps the old pair). */
  replace_file("server.crt", "server2.crt");
  replace_file("server.key", "server2.key");
  replace_file("ca.crt", "both-cas.crt");
  assert_int_equal(etcd_fixture_kill(g_etcd, 0), 0);
  assert_int_equal(etcd_fixture_restart(g_etcd, 0), 0);

  /* Still on the old CA: etcd's new certificate does not verify. */
  int rc = wagma_etcd_put(etcd, "/wagma/rot/stale", "x", 1, 0, NULL);
  fprintf(stderr, "on the old CA: %s: %s\n", wagma_strerror(rc), wagma_etcd_errmsg(etcd));
  assert_int_not_equal(rc, 0);

  /* The Secret is updated: the same handle picks the new files up. */
  replace_file("my-ca.crt", "ca2.crt");
  replace_file("my-client.key", "client2.key");
  replace_file("my-client.crt", "client2.crt");
  int64_t t0 = test_now_ms();
  while ((rc = wagma_etcd_put(etcd, "/wagma/rot/after", "2", 1, 0, NULL)) != 0 &&
         test_now_ms() - t0 < 10000)
    usleep(200000);
  int64_t took = test_now_ms() - t0;
  fprintf(stderr, "on the new files: %s after %lld ms (%s)\n", wagma_strerror(rc), (long long)took,
          rc ? wagma_etcd_errmsg(etcd) : "");
  assert_int_equal(rc, 0);
  assert_true(took <= 5000); /* the files are looked at once a second */
  pthread_mutex_lock(&g_log_lock);
  int reloads = g_tls_reloads;
  pthread_mutex_unlock(&g_log_lock);
  assert_true(reloads >= 1);
  /* The watch that was open before the rotation delivers events again. */
  int seen_after = 0;
  for (int64_t w0 = test_now_ms(); !seen_after && test_now_ms() - w0 < 10000;) {
    recorder_wait_events(&rec, rec.n + 1, 500);
    pthread_mutex_lock(&rec.lock);
    for (size_t i = 0; i < rec.n; i++)
      seen_after |= strcmp(rec.events[i].key, "/wagma/rot/after") == 0;
    pthread_mutex_unlock(&rec.lock);
  }
  assert_true(seen_after);
  wagma_etcd_watch_stop(watch);
  recorder_destroy(&rec);
  wagma_etcd_close(etcd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_options_are_refused_at_open),
      cmocka_unit_test(tls_and_user_work),
      cmocka_unit_test(wrong_ca_fails_fast_and_says_tls),
      cmocka_unit_test(missing_client_cert_fails_fast),
      cmocka_unit_test(plain_client_is_refused),
      cmocka_unit_test(wrong_password_says_so),
      cmocka_unit_test(certificate_cn_is_the_user),
      cmocka_unit_test(rejected_tokens_are_renewed),
      cmocka_unit_test(rotated_password_is_read_again),
      cmocka_unit_test(rotated_certificates_are_read_again), /* last: new certificates */
  };
  if (getenv("TEST_FILTER") != NULL)
    cmocka_set_test_filter(getenv("TEST_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
