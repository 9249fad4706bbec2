/* Unit tests of the etcd options wagma-coordinator and wagma-agent share (etcd/cli.c): the
 * defaults, each option's good and bad values with the message the programs print, the
 * password from the environment, the check of the whole, the usage lines at both programs'
 * columns, and the start-up wait giving up or stopped on an endpoint nobody listens on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wagma/etcd.h"

/* An endpoint nobody listens on: connections are refused at once. */
#define DEAD "127.0.0.1:1"

static void defaults(void **state) {
  (void)state;
  wagma_etcd_cli_t cli;
  memset(&cli, 0x5a, sizeof cli);
  wagma_etcd_cli_init(&cli);
  assert_null(cli.endpoints);
  assert_int_equal(cli.call_timeout_ms, 3000);
  assert_true(cli.startup_timeout_s == 30.0);
  assert_null(cli.ca_file);
  assert_null(cli.cert_file);
  assert_null(cli.key_file);
  assert_null(cli.username);
  assert_null(cli.password_file);
  assert_null(cli.password);
}

static void good_values(void **state) {
  (void)state;
  wagma_etcd_cli_t cli;
  char err[256] = "";
  wagma_etcd_cli_init(&cli);
  const char *eps = "127.0.0.1:2379,[::1]:22379,etcd-0.etcd:2379";
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_ENDPOINTS, eps, err, sizeof err), 1);
  assert_ptr_equal(cli.endpoints, eps); /* kept by pointer */
  static const struct {
    const char *arg;
    int ms;
  } ms[] = {{"100", 100}, {"600000", 600000}, {"1500.9", 1500}, {"1e3", 1000}, {" 250", 250}};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    assert_int_equal(
        wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_TIMEOUT_MS, ms[i].arg, err, sizeof err), 1);
    assert_int_equal(cli.call_timeout_ms, ms[i].ms);
  }
  static const struct {
    const char *arg;
    double s;
  } st[] = {{"0", 0}, {"86400", 86400}, {"2.5", 2.5}, {"30", 30}};
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
    assert_int_equal(
        wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_STARTUP_TIMEOUT, st[i].arg, err, sizeof err), 1);
    assert_true(cli.startup_timeout_s == st[i].s);
  }
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_CACERT, "ca.pem", err, 8), 1);
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_CERT, "c.pem", err, 8), 1);
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_KEY, "k.pem", err, 8), 1);
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_USER, "u", err, 8), 1);
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_PASSWORD_FILE, "pw", err, 8), 1);
  assert_string_equal(cli.ca_file, "ca.pem");
  assert_string_equal(cli.cert_file, "c.pem");
  assert_string_equal(cli.key_file, "k.pem");
  assert_string_equal(cli.username, "u");
  assert_string_equal(cli.password_file, "pw");
  assert_string_equal(err, "");
}

/* Each bad value: WAGMA_EINVAL, the message the programs print after their name, and the
 * option's value unchanged. */
static void bad_values(void **state) {
  (void)state;
  wagma_etcd_cli_t cli;
  char err[256];
  wagma_etcd_cli_init(&cli);
  static const char *const bad_ms[] = {"99", "600001", "", "abc", "100x", "nan", "-3000", "1e9"};
  for (size_t i = 0; i < sizeof bad_ms / sizeof bad_ms[0]; i++) {
    err[0] = '\0';
    assert_int_equal(
        wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_TIMEOUT_MS, bad_ms[i], err, sizeof err),
        WAGMA_EINVAL);
    assert_string_equal(err, "--etcd-timeout-ms must be 100..600000");
    assert_int_equal(cli.call_timeout_ms, 3000);
  }
  static const char *const bad_s[] = {"-1", "86401", "", "x", "5s", "inf", "-0.5"};
  for (size_t i = 0; i < sizeof bad_s / sizeof bad_s[0]; i++) {
    err[0] = '\0';
    assert_int_equal(
        wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_STARTUP_TIMEOUT, bad_s[i], err, sizeof err),
        WAGMA_EINVAL);
    assert_string_equal(err, "--etcd-startup-timeout must be 0..86400 seconds");
    assert_true(cli.startup_timeout_s == 30.0);
  }
  static const char *const bad_eps[] = {"bad:port", "", "h:0", "ftp://h:1",
                                        "http://a:1,https://b:2"};
  for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++) {
    char want[64];
    err[0] = '\0';
    assert_int_equal(
        wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_ENDPOINTS, bad_eps[i], err, sizeof err),
        WAGMA_EINVAL);
    snprintf(want, sizeof want, "bad --etcd '%s': ", bad_eps[i]);
    assert_memory_equal(err, want, strlen(want)); /* then wagma_etcd_endpoints_check's why */
    assert_true(strlen(err) > strlen(want));
    assert_null(cli.endpoints);
  }
}

/* Options of the program (or getopt's '?'): not taken, nothing changed. */
static void not_ours(void **state) {
  (void)state;
  wagma_etcd_cli_t cli, before;
  char err[64] = "";
  wagma_etcd_cli_init(&cli);
  before = cli;
  static const int others[] = {'h',
                               '?',
                               'e',
                               'E',
                               'U',
                               0,
                               1001,
                               1005,
                               WAGMA_ETCD_CLI_ENDPOINTS - 1,
                               WAGMA_ETCD_CLI_PASSWORD_FILE + 1};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
    assert_int_equal(wagma_etcd_cli_option(&cli, others[i], "x", err, sizeof err), 0);
  assert_memory_equal(&cli, &before, sizeof cli);
  assert_string_equal(err, "");
}

static void finish_password_and_check(void **state) {
  (void)state;
  wagma_etcd_cli_t cli;
  char err[512];
  setenv("WAGMA_ETCD_PASSWORD", "s3cret", 1);
  /* no user: no password taken */
  wagma_etcd_cli_init(&cli);
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_ENDPOINTS, DEAD, err, 8), 1);
  assert_int_equal(wagma_etcd_cli_finish(&cli, err, sizeof err), 0);
  assert_null(cli.password);
  /* a user: the password from the environment */
  assert_int_equal(wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_USER, "u", err, 8), 1);
  assert_int_equal(wagma_etcd_cli_finish(&cli, err, sizeof err), 0);
  assert_non_null(cli.password);
  assert_string_equal(cli.password, "s3cret");
  /* a user with a password file: the file, not the environment (one that does not read
   * fails the check) */
  assert_int_equal(
      wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_PASSWORD_FILE, "/nonexistent/pw", err, 8), 1);
  err[0] = '\0';
  assert_int_equal(wagma_etcd_cli_finish(&cli, err, sizeof err), WAGMA_EINVAL);
  assert_null(cli.password);
  assert_memory_equal(err, "bad etcd options: ", 18);
  assert_non_null(strstr(err, "/nonexistent/pw"));
  /* a user and no password anywhere */
  unsetenv("WAGMA_ETCD_PASSWORD");
  wagma_etcd_cli_init(&cli);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_ENDPOINTS, DEAD, err, 8);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_USER, "u", err, 8);
  assert_int_equal(wagma_etcd_cli_finish(&cli, err, sizeof err), WAGMA_EINVAL);
  assert_memory_equal(err, "bad etcd options: ", 18);
  /* TLS files that do not read, a certificate without its key, TLS to an http:// endpoint */
  static const struct {
    int opt;
    const char *arg;
    const char *endpoints;
  } bad[] = {{WAGMA_ETCD_CLI_CACERT, "/nonexistent/ca.pem", DEAD},
             {WAGMA_ETCD_CLI_CERT, "/etc/hostname", DEAD},
             {WAGMA_ETCD_CLI_KEY, "/etc/hostname", DEAD},
             {WAGMA_ETCD_CLI_CACERT, "/etc/hostname", "http://" DEAD}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    wagma_etcd_cli_init(&cli);
    wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_ENDPOINTS, bad[i].endpoints, err, 8);
    assert_int_equal(wagma_etcd_cli_option(&cli, bad[i].opt, bad[i].arg, err, 8), 1);
    err[0] = '\0';
    assert_int_equal(wagma_etcd_cli_finish(&cli, err, sizeof err), WAGMA_EINVAL);
    assert_memory_equal(err, "bad etcd options: ", 18);
    assert_true(strlen(err) > 18);
  }
}

static void fills_the_handle_options(void **state) {
  (void)state;
  wagma_etcd_cli_t cli;
  char err[64];
  int user;
  wagma_etcd_cli_init(&cli);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_ENDPOINTS, DEAD, err, sizeof err);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_TIMEOUT_MS, "700", err, sizeof err);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_CACERT, "ca", err, sizeof err);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_CERT, "cert", err, sizeof err);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_KEY, "key", err, sizeof err);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_USER, "user", err, sizeof err);
  wagma_etcd_cli_option(&cli, WAGMA_ETCD_CLI_PASSWORD_FILE, "pwfile", err, sizeof err);
  wagma_etcd_options_t eo = {.log_user = &user, .ping_key = "/wagma/"};
  wagma_etcd_cli_options(&cli, &eo);
  assert_string_equal(eo.endpoints, DEAD);
  assert_int_equal(eo.call_timeout_ms, 700);
  assert_string_equal(eo.ca_file, "ca");
  assert_string_equal(eo.cert_file, "cert");
  assert_string_equal(eo.key_file, "key");
  assert_string_equal(eo.username, "user");
  assert_string_equal(eo.password_file, "pwfile");
  assert_null(eo.password);
  assert_ptr_equal(eo.log_user, &user); /* left as they were */
  assert_null(eo.log_fn);
  assert_string_equal(eo.ping_key, "/wagma/");
}

static void tls_as_logged(void **state) {
  (void)state;
  wagma_etcd_cli_t cli;
  wagma_etcd_cli_init(&cli);
  assert_false(wagma_etcd_cli_tls(&cli));
  cli.endpoints = "http://a:1";
  assert_false(wagma_etcd_cli_tls(&cli));
  cli.key_file = "k"; /* a key alone does not say TLS (the check refuses it anyway) */
  assert_false(wagma_etcd_cli_tls(&cli));
  cli.endpoints = "a:1,https://b:2";
  assert_true(wagma_etcd_cli_tls(&cli));
  wagma_etcd_cli_init(&cli);
  cli.ca_file = "ca";
  assert_true(wagma_etcd_cli_tls(&cli));
  wagma_etcd_cli_init(&cli);
  cli.cert_file = "c";
  assert_true(wagma_etcd_cli_tls(&cli));
}

/* The lines wagma-agent's --help printed before they were shared (column 26); the
 * coordinator's column is 23. */
static const char agent_lines[] =
    "  --etcd-timeout-ms MS    deadline of each etcd call (default 3000)\n"
    "  --etcd-startup-timeout S  give up (exit 4) when etcd does not answer at startup\n"
    "                          within S seconds (default 30; 0 = wait for ever); once\n"
    "                          running, etcd outages are survived\n"
    "  --etcd-cacert FILE      TLS to etcd: CA bundle (PEM) that signs etcd's certificate\n"
    "  --etcd-cert FILE        client certificate for etcd --client-cert-auth (PEM)\n"
    "  --etcd-key FILE         its private key (PEM)\n"
    "  --etcd-user NAME        etcd user (etcd auth enabled); its password from\n"
    "  --etcd-password-file FILE  (re-read at each authentication), else from\n"
    "                          $WAGMA_ETCD_PASSWORD; never on the command line\n";
static const char coordinator_lines[] =
    "  --etcd-timeout-ms MS deadline of each etcd call (default 3000)\n"
    "  --etcd-startup-timeout S  give up (exit 4) when etcd does not answer at startup\n"
    "                       within S seconds (default 30; 0 = wait for ever); once\n"
    "                       running, etcd outages are survived\n"
    "  --etcd-cacert FILE   TLS to etcd: CA bundle (PEM) that signs etcd's certificate\n"
    "  --etcd-cert FILE     client certificate for etcd --client-cert-auth (PEM)\n"
    "  --etcd-key FILE      its private key (PEM)\n"
    "  --etcd-user NAME     etcd user (etcd auth enabled); its password from\n"
    "  --etcd-password-file FILE  (re-read at each authentication), else from\n"
    "                       $WAGMA_ETCD_PASSWORD; never on the command line\n";

static void usage_lines(void **state) {
  (void)state;
  char out[2048], small[40];
  assert_int_equal(wagma_etcd_cli_usage(26, out, sizeof out), (int)strlen(agent_lines));
  assert_string_equal(out, agent_lines);
  assert_int_equal(wagma_etcd_cli_usage(23, out, sizeof out), (int)strlen(coordinator_lines));
  assert_string_equal(out, coordinator_lines);
  /* truncated, NUL-terminated, the whole length returned; NULL measures */
  memset(small, 'x', sizeof small);
  assert_int_equal(wagma_etcd_cli_usage(26, small, sizeof small), (int)strlen(agent_lines));
  assert_int_equal(strlen(small), sizeof small - 1);
  assert_memory_equal(small, agent_lines, sizeof small - 1);
  assert_int_equal(wagma_etcd_cli_usage(26, NULL, 0), (int)strlen(agent_lines));
}

static int stops;
static int stop_after_two(void *user) {
  (void)user;
  return ++stops >= 2;
}

/* The wait on an endpoint nobody listens on: gives up after its limit with the message the
 * programs print, or stops when asked. */
static void wait_gives_up_or_stops(void **state) {
  (void)state;
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_options_t eo = {.endpoints = DEAD, .call_timeout_ms = 200};
  char err[1024] = "";
  assert_int_equal(wagma_etcd_open(&eo, &etcd), 0);
  assert_int_equal(wagma_etcd_wait_ready(etcd, "dead-etcd", 0.4, NULL, NULL, err, sizeof err),
                   WAGMA_EUNAVAIL);
  const char *want = "etcd dead-etcd did not answer within 0 s (--etcd-startup-timeout): ";
  assert_memory_equal(err, want, strlen(want));
  assert_non_null(strstr(err, "; giving up"));
  stops = 0;
  assert_int_equal(
      wagma_etcd_wait_ready(etcd, "dead-etcd", 0, stop_after_two, NULL, err, sizeof err),
      WAGMA_ECANCELED);
  assert_int_equal(stops, 2);
  assert_string_equal(err, "stopped while waiting for etcd");
  wagma_etcd_close(etcd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults),
      cmocka_unit_test(good_values),
      cmocka_unit_test(bad_values),
      cmocka_unit_test(not_ours),
      cmocka_unit_test(finish_password_and_check),
      cmocka_unit_test(fills_the_handle_options),
      cmocka_unit_test(tls_as_logged),
      cmocka_unit_test(usage_lines),
      cmocka_unit_test(wait_gives_up_or_stops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
