/* cli.c — the etcd options the daemons share (--etcd, --etcd-timeout-ms,
 * --etcd-startup-timeout, the TLS files, the user) and their start-up wait for etcd.
 *
 * Owns nothing: the parsed options point into argv and the environment. The wait uses the
 * handle's public calls and its log_fn.
 * Threads: none of its own; the parser is for one thread at a time (getopt's), the wait runs
 * on its caller's thread (wagma-coordinator's main thread, wagma-agent's control thread). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_internal.h"
#include "wagma/clock_internal.h"

void wagma_etcd_cli_init(wagma_etcd_cli_t *cli) {
  memset(cli, 0, sizeof *cli);
  cli->call_timeout_ms = 3000;
  cli->startup_timeout_s = 30;
}

/* A number as strtod reads it (a fraction or an exponent is taken), within lo..hi; NaN
 * never is. 0 or -1. */
static int parse_number(const char *s, double lo, double hi, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= lo && v <= hi))
    return -1;
  *out = v;
  return 0;
}

int wagma_etcd_cli_option(wagma_etcd_cli_t *cli, int opt, const char *arg, char *err,
                          size_t err_len) {
  double v;
  switch (opt) {
  case WAGMA_ETCD_CLI_ENDPOINTS: {
    char why[256];
    if (wagma_etcd_endpoints_check(arg, why, sizeof why) != 0) {
      wg_errf(err, err_len, "bad --etcd '%s': %s", arg, why);
      return WAGMA_EINVAL;
    }
    cli->endpoints = arg;
    return 1;
  }
  case WAGMA_ETCD_CLI_TIMEOUT_MS:
    if (parse_number(arg, 100, 600000, &v)) {
      wg_errf(err, err_len, "--etcd-timeout-ms must be 100..600000");
      return WAGMA_EINVAL;
    }
    cli->call_timeout_ms = (int)v;
    return 1;
  case WAGMA_ETCD_CLI_STARTUP_TIMEOUT:
    if (parse_number(arg, 0, 86400, &cli->startup_timeout_s)) {
      wg_errf(err, err_len, "--etcd-startup-timeout must be 0..86400 seconds");
      return WAGMA_EINVAL;
    }
    return 1;
  case WAGMA_ETCD_CLI_CACERT: cli->ca_file = arg; return 1;
  case WAGMA_ETCD_CLI_CERT: cli->cert_file = arg; return 1;
  case WAGMA_ETCD_CLI_KEY: cli->key_file = arg; return 1;
  case WAGMA_ETCD_CLI_USER: cli->username = arg; return 1;
  case WAGMA_ETCD_CLI_PASSWORD_FILE: cli->password_file = arg; return 1;
  default: return 0;
  }
}

void wagma_etcd_cli_options(const wagma_etcd_cli_t *cli, wagma_etcd_options_t *out) {
  out->endpoints = cli->endpoints;
  out->call_timeout_ms = cli->call_timeout_ms;
  out->ca_file = cli->ca_file;
  out->cert_file = cli->cert_file;
  out->key_file = cli->key_file;
  out->username = cli->username;
  out->password = cli->password;
  out->password_file = cli->password_file;
}

int wagma_etcd_cli_finish(wagma_etcd_cli_t *cli, char *err, size_t err_len) {
  char why[512];
  wagma_etcd_options_t eo = {0};
  cli->password = cli->username && !cli->password_file ? getenv("WAGMA_ETCD_PASSWORD") : NULL;
  wagma_etcd_cli_options(cli, &eo);
  if (wagma_etcd_options_check(&eo, why, sizeof why) != 0) {
    wg_errf(err, err_len, "bad etcd options: %s", why);
    return WAGMA_EINVAL;
  }
  return 0;
}

int wagma_etcd_cli_tls(const wagma_etcd_cli_t *cli) {
  return cli->ca_file || cli->cert_file || (cli->endpoints && strstr(cli->endpoints, "https://"));
}

/* The usage rows: the flag with its argument, then its description's lines. */
static const char *const usage_rows[][4] = {
    {"--etcd-timeout-ms MS", "deadline of each etcd call (default 3000)"},
    {"--etcd-startup-timeout S", "give up (exit 4) when etcd does not answer at startup",
     "within S seconds (default 30; 0 = wait for ever); once",
     "running, etcd outages are survived"},
    {"--etcd-cacert FILE", "TLS to etcd: CA bundle (PEM) that signs etcd's certificate"},
    {"--etcd-cert FILE", "client certificate for etcd --client-cert-auth (PEM)"},
    {"--etcd-key FILE", "its private key (PEM)"},
    {"--etcd-user NAME", "etcd user (etcd auth enabled); its password from"},
    {"--etcd-password-file FILE", "(re-read at each authentication), else from",
     "$WAGMA_ETCD_PASSWORD; never on the command line"},
};

/* Appends to out (len bytes, truncated, NUL-terminated when len > 0) at *n, which counts
 * every character, kept or not. */
static void append(char *out, size_t len, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *out, size_t len, size_t *n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = *n < len ? vsnprintf(out + *n, len - *n, fmt, ap) : vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  *n += w > 0 ? (size_t)w : 0;
}

int wagma_etcd_cli_usage(int column, char *out, size_t len) {
  size_t n = 0;
  if (out == NULL)
    len = 0;
  if (len > 0)
    out[0] = '\0';
  for (size_t r = 0; r < sizeof usage_rows / sizeof usage_rows[0]; r++) {
    const char *const *row = usage_rows[r];
    int flag = 2 + (int)strlen(row[0]);
    append(out, len, &n, "  %s%*s%s\n", row[0], flag + 1 <= column ? column - flag : 2, "", row[1]);
    for (int i = 2; i < 4 && row[i]; i++)
      append(out, len, &n, "%*s%s\n", column, "", row[i]);
  }
  return (int)n;
}

int wagma_etcd_wait_ready(wagma_etcd_t *etcd, const char *endpoints, double limit_s,
                          wagma_etcd_stop_fn stop, void *stop_user, char *err, size_t err_len) {
  double t0 = wg_mono(), next_log = t0 + 5;
  for (;;) {
    int e = wagma_etcd_ping(etcd, NULL);
    if (e == 0)
      return 0;
    double now = wg_mono();
    if (e != WAGMA_EUNAVAIL && e != WAGMA_ETIMEDOUT) {
      wg_errf(err, err_len, "etcd %s refused us: %s (%s)", endpoints, wagma_strerror(e),
              wagma_etcd_errmsg(etcd));
      return e;
    }
    if (limit_s > 0 && now - t0 >= limit_s) {
      wg_errf(err, err_len,
              "etcd %s did not answer within %.0f s (--etcd-startup-timeout): %s; giving up",
              endpoints, limit_s, wagma_etcd_errmsg(etcd));
      return WAGMA_EUNAVAIL;
    }
    if (stop && stop(stop_user)) {
      wg_errf(err, err_len, "stopped while waiting for etcd");
      return WAGMA_ECANCELED;
    }
    if (now >= next_log) {
      wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_WARN,
              "waiting for etcd %s (%.0f s so far): %s", endpoints, now - t0,
              wagma_etcd_errmsg(etcd));
      next_log = now + 5;
    }
    double left = limit_s > 0 ? t0 + limit_s - now : 0.5;
    wg_sleep_s(left < 0.5 ? left : 0.5);
  }
}
