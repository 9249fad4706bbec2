/* coordinator/main.c — wagma-coordinator: options, logging, signals, start and stop order.
 *
 * Start: etcd handle (the endpoints checked first: a malformed one is a usage error, exit 2)
 * -> wait until etcd answers, at most --etcd-startup-timeout (else exit 4; once running, etcd
 * outages are survived) -> metrics -> bind the REST socket (resolves port 0) -> election
 * (campaign thread) -> scheduler (reconcile thread) -> event hub -> read cache (load, watch) ->
 * REST server. Stop (SIGINT / SIGTERM): REST server -> read cache -> hub -> scheduler -> election
 * (revokes the lease so a follower takes over at once) -> etcd. The main thread only waits for a
 * signal. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "coord.h"
#include "election.h"
#include "http.h"
#include "hub.h"
#include "metrics.h"
#include "scheduler.h"
#include "wagma/log_internal.h"

static int g_log_level = WAGMA_LOG_INFO;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

static void log_stderr(void *user, int level, const char *msg) {
  const char *id = user;
  if (level < g_log_level)
    return;
  struct timespec ts;
  struct tm tm;
  char when[32];
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  pthread_mutex_lock(&g_log_mu);
  fprintf(stderr, "%s.%03ldZ %-5s coordinator[%s] %s\n", when, ts.tv_nsec / 1000000L,
          wagma_log_level_name(level), id, msg);
  pthread_mutex_unlock(&g_log_mu);
}

static void usage(FILE *f) {
  fprintf(f, "usage: wagma-coordinator --etcd HOST:PORT[,HOST:PORT...] [options]\n"
             "\n"
             "The wagma control plane: REST/JSON API (docs/api.md, api/openapi.yaml), job\n"
             "scheduling and plans, state in etcd. Run two or more for failover: one leads.\n"
             "\n"
             "  --listen HOST:PORT   REST address (default 127.0.0.1:8080; port 0 = any free)\n"
             "  --etcd ENDPOINTS     etcd client endpoints, comma separated (required)\n"
             "  --prefix PREFIX      etcd key prefix (default /wagma)\n"
             "  --token-file FILE    bearer token for mutations (else $WAGMA_TOKEN; none = open)\n"
             "  --id NAME            this replica's id (default <hostname>-<pid>)\n"
             "  --lease-ttl SECONDS  leader lease TTL (default 5): failover time\n"
             "  --max-body BYTES     request body limit (default 65536)\n"
             "  --threads N          HTTP worker threads (default 4)\n"
             "  --etcd-timeout-ms MS deadline of each etcd call (default 3000)\n"
             "  --etcd-startup-timeout S  give up (exit 4) when etcd does not answer at\n"
             "                       startup within S seconds (default 30; 0 = wait for ever)\n"
             "  --etcd-cacert FILE   TLS to etcd: CA bundle (PEM) that signs etcd's certificate\n"
             "  --etcd-cert FILE     client certificate for etcd --client-cert-auth (PEM)\n"
             "  --etcd-key FILE      its private key (PEM)\n"
             "  --etcd-user NAME     etcd user (etcd auth enabled); its password from\n"
             "  --etcd-password-file FILE  (re-read at each authentication), else from\n"
             "                       $WAGMA_ETCD_PASSWORD; never on the command line\n"
             "  --quarantine S       an agent that reported it cannot serve a job that others\n"
             "                       run is not assigned for S seconds, or until it registers\n"
             "                       again (default 300; 0 = never quarantine)\n"
             "  --read-cache on|off  answer reads from the watch-fed cache (default on); off:\n"
             "                       every read is an etcd read, and no event streams\n"
             "  --read-staleness-ms MS  answer a read from the cache at once when it was\n"
             "                       verified current within MS (default 0: each read waits\n"
             "                       for a sync after it arrived, i.e. reads are consistent)\n"
             "  --sse-heartbeat-ms MS  comment line on every event stream (default 15000)\n"
             "  --sse-client-buffer BYTES  queued for one stream before it is dropped\n"
             "                       (default 1048576)\n"
             "  --sse-max-clients N  event streams open at once (default 256)\n"
             "  --log-level LEVEL    debug, info, warn or error (default info)\n"
             "  --help               this text\n"
             "\n"
             "Exit status: 0 stopped by SIGINT/SIGTERM; 1 failure; 2 usage error (bad flag or\n"
             "address); 4 etcd did not answer within --etcd-startup-timeout, or refused us (TLS,\n"
             "user or password).\n");
}

static int parse_listen(const char *s, char *host, size_t hlen, int *port) {
  const char *colon = strrchr(s, ':');
  if (!colon || (size_t)(colon - s) >= hlen)
    return -1;
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = '\0';
  if (!host[0])
    snprintf(host, hlen, "0.0.0.0");
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (*end || p < 0 || p > 65535 || end == colon + 1)
    return -1;
  *port = (int)p;
  return 0;
}

static int read_token(const char *path, char *out, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(out, 1, len - 1, f);
  int toolong = !feof(f) && n == len - 1;
  fclose(f);
  if (toolong)
    return -1;
  out[n] = '\0';
  while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
    out[--n] = '\0';
  return 0;
}

/* Waits until etcd answers, at most limit_s seconds (0 = for ever; each try may take one
 * --etcd-timeout-ms more). Returns 0, 4 (gave up, with a message on stderr) or -1 when SIGINT
 * or SIGTERM came meanwhile (the exit status is then 0). */
static int wait_for_etcd(wg_coord_t *c, const char *endpoints, int limit_s, const sigset_t *sigs) {
  double t0 = wg_mono(), next_log = t0 + 5;
  for (;;) {
    int e = wagma_etcd_ping(c->etcd, NULL);
    if (e == 0)
      return 0;
    double now = wg_mono();
    if (e != WAGMA_EUNAVAIL && e != WAGMA_ETIMEDOUT) {
      fprintf(stderr, "wagma-coordinator: etcd %s refused us: %s (%s)\n", endpoints,
              wagma_strerror(e), wagma_etcd_errmsg(c->etcd));
      return 4;
    }
    if (limit_s > 0 && now - t0 >= limit_s) {
      fprintf(stderr,
              "wagma-coordinator: etcd %s did not answer within %d s (--etcd-startup-timeout): "
              "%s; giving up\n",
              endpoints, limit_s, wagma_etcd_errmsg(c->etcd));
      return 4;
    }
    sigset_t pending;
    if (sigpending(&pending) == 0 &&
        (sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1)) {
      int sig;
      sigwait(sigs, &sig); /* consume it */
      return -1;
    }
    if (now >= next_log) {
      wg_logf(c->log, c->log_user, WAGMA_LOG_WARN, "waiting for etcd %s (%.0f s so far): %s",
              endpoints, now - t0, wagma_etcd_errmsg(c->etcd));
      next_log = now + 5;
    }
    double left = limit_s > 0 ? t0 + limit_s - now : 0.5;
    struct timespec ts = {0, (long)((left < 0.5 ? left : 0.5) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

int main(int argc, char **argv) {
  static struct option longopts[] = {{"listen", required_argument, 0, 'l'},
                                     {"etcd", required_argument, 0, 'e'},
                                     {"prefix", required_argument, 0, 'p'},
                                     {"token-file", required_argument, 0, 't'},
                                     {"id", required_argument, 0, 'i'},
                                     {"lease-ttl", required_argument, 0, 'L'},
                                     {"max-body", required_argument, 0, 'b'},
                                     {"threads", required_argument, 0, 'T'},
                                     {"log-level", required_argument, 0, 'v'},
                                     {"etcd-timeout-ms", required_argument, 0, 'E'},
                                     {"etcd-startup-timeout", required_argument, 0, 'U'},
                                     {"etcd-cacert", required_argument, 0, 1001},
                                     {"etcd-cert", required_argument, 0, 1002},
                                     {"etcd-key", required_argument, 0, 1003},
                                     {"etcd-user", required_argument, 0, 1004},
                                     {"etcd-password-file", required_argument, 0, 1005},
                                     {"quarantine", required_argument, 0, 'Q'},
                                     {"read-cache", required_argument, 0, 'R'},
                                     {"read-staleness-ms", required_argument, 0, 'S'},
                                     {"sse-heartbeat-ms", required_argument, 0, 'H'},
                                     {"sse-client-buffer", required_argument, 0, 'B'},
                                     {"sse-max-clients", required_argument, 0, 'M'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  wg_coord_t c;
  const char *listen = "127.0.0.1:8080", *endpoints = NULL, *prefix = "/wagma";
  const char *token_file = NULL;
  /* etcd TLS and user (argv strings; the password from a file or the environment) */
  const char *etcd_ca = NULL, *etcd_cert = NULL, *etcd_key = NULL, *etcd_user = NULL;
  const char *etcd_password_file = NULL, *etcd_password = NULL;
  int etcd_timeout = 3000, etcd_startup_timeout = 30, opt, rc = 1;
  struct MHD_Daemon *http = NULL;
  sigset_t sigs;
  memset(&c, 0, sizeof c);
  c.max_body = 65536;
  c.lease_ttl_s = 5;
  c.threads = 4;
  c.quarantine_s = 300;
  c.read_cache = 1;
  c.sse_heartbeat_s = WG_SSE_HEARTBEAT_S;
  c.sse_client_buffer = WG_SSE_CLIENT_BUFFER;
  c.sse_max_clients = WG_SSE_MAX_CLIENTS;
  {
    char host[48] = "coordinator";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    for (char *q = host; *q; q++)
      if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
            *q == '-' || *q == '.' || *q == '_'))
        *q = '-';
    snprintf(c.id, sizeof c.id, "%s-%d", host, (int)getpid());
  }
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    char *end = NULL;
    switch (opt) {
    case 'l': listen = optarg; break;
    case 'e': endpoints = optarg; break;
    case 'p': prefix = optarg; break;
    case 't': token_file = optarg; break;
    case 'i':
      if (!wagma_api_name_valid(optarg)) {
        fprintf(stderr, "wagma-coordinator: --id must be 1-63 characters of [A-Za-z0-9._-]\n");
        return 2;
      }
      snprintf(c.id, sizeof c.id, "%s", optarg);
      break;
    case 'L':
      c.lease_ttl_s = (int)strtol(optarg, &end, 10);
      if (*end || c.lease_ttl_s < 1 || c.lease_ttl_s > 3600) {
        fprintf(stderr, "wagma-coordinator: --lease-ttl must be 1..3600 seconds\n");
        return 2;
      }
      break;
    case 'b': {
      long long v = strtoll(optarg, &end, 10);
      if (*end || v < 256 || v > 64LL * 1024 * 1024) {
        fprintf(stderr, "wagma-coordinator: --max-body must be 256..67108864\n");
        return 2;
      }
      c.max_body = (size_t)v;
      break;
    }
    case 'T':
      c.threads = (int)strtol(optarg, &end, 10);
      if (*end || c.threads < 1 || c.threads > 256) {
        fprintf(stderr, "wagma-coordinator: --threads must be 1..256\n");
        return 2;
      }
      break;
    case 'E':
      etcd_timeout = (int)strtol(optarg, &end, 10);
      if (*end || etcd_timeout < 100 || etcd_timeout > 600000) {
        fprintf(stderr, "wagma-coordinator: --etcd-timeout-ms must be 100..600000\n");
        return 2;
      }
      break;
    case 'U':
      etcd_startup_timeout = (int)strtol(optarg, &end, 10);
      if (!optarg[0] || *end || etcd_startup_timeout < 0 || etcd_startup_timeout > 86400) {
        fprintf(stderr, "wagma-coordinator: --etcd-startup-timeout must be 0..86400 seconds\n");
        return 2;
      }
      break;
    case 1001: etcd_ca = optarg; break;
    case 1002: etcd_cert = optarg; break;
    case 1003: etcd_key = optarg; break;
    case 1004: etcd_user = optarg; break;
    case 1005: etcd_password_file = optarg; break;
    case 'Q':
      c.quarantine_s = (int)strtol(optarg, &end, 10);
      if (!optarg[0] || *end || c.quarantine_s < 0 || c.quarantine_s > 86400 * 7) {
        fprintf(stderr, "wagma-coordinator: --quarantine must be 0..604800 seconds\n");
        return 2;
      }
      break;
    case 'R':
      if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0) {
        fprintf(stderr, "wagma-coordinator: --read-cache must be on or off\n");
        return 2;
      }
      c.read_cache = strcmp(optarg, "on") == 0;
      break;
    case 'S': {
      long v = strtol(optarg, &end, 10);
      if (!optarg[0] || *end || v < 0 || v > 60000) {
        fprintf(stderr, "wagma-coordinator: --read-staleness-ms must be 0..60000\n");
        return 2;
      }
      c.read_staleness_s = (double)v / 1000.0;
      break;
    }
    case 'H': {
      long v = strtol(optarg, &end, 10);
      if (!optarg[0] || *end || v < 10 || v > 600000) {
        fprintf(stderr, "wagma-coordinator: --sse-heartbeat-ms must be 10..600000\n");
        return 2;
      }
      c.sse_heartbeat_s = (double)v / 1000.0;
      break;
    }
    case 'B': {
      long long v = strtoll(optarg, &end, 10);
      if (!optarg[0] || *end || v < 4096 || v > (1LL << 30)) {
        fprintf(stderr, "wagma-coordinator: --sse-client-buffer must be 4096..1073741824\n");
        return 2;
      }
      c.sse_client_buffer = (size_t)v;
      break;
    }
    case 'M': {
      long v = strtol(optarg, &end, 10);
      if (!optarg[0] || *end || v < 0 || v > WG_HTTP_MAX_CONNECTIONS) {
        fprintf(stderr, "wagma-coordinator: --sse-max-clients must be 0..%d\n",
                WG_HTTP_MAX_CONNECTIONS);
        return 2;
      }
      c.sse_max_clients = (int)v;
      break;
    }
    case 'v':
      if (strcmp(optarg, "debug") == 0)
        g_log_level = WAGMA_LOG_DEBUG;
      else if (strcmp(optarg, "info") == 0)
        g_log_level = WAGMA_LOG_INFO;
      else if (strcmp(optarg, "warn") == 0)
        g_log_level = WAGMA_LOG_WARN;
      else if (strcmp(optarg, "error") == 0)
        g_log_level = WAGMA_LOG_ERROR;
      else {
        fprintf(stderr, "wagma-coordinator: --log-level must be debug, info, warn or error\n");
        return 2;
      }
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "wagma-coordinator: unexpected argument %s\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (!endpoints) {
    fprintf(stderr, "wagma-coordinator: --etcd is required\n");
    usage(stderr);
    return 2;
  }
  {
    char why[256];
    if (wagma_etcd_endpoints_check(endpoints, why, sizeof why) != 0) {
      fprintf(stderr, "wagma-coordinator: bad --etcd '%s': %s\n", endpoints, why);
      return 2;
    }
  }
  if (etcd_user && !etcd_password_file)
    etcd_password = getenv("WAGMA_ETCD_PASSWORD");
  char ping_key[sizeof c.keys.prefix + 2];
  wagma_etcd_options_t eo = {.endpoints = endpoints,
                             .call_timeout_ms = etcd_timeout,
                             .ca_file = etcd_ca,
                             .cert_file = etcd_cert,
                             .key_file = etcd_key,
                             .username = etcd_user,
                             .password = etcd_password,
                             .password_file = etcd_password_file,
                             .ping_key = ping_key};
  {
    char why[512];
    if (wagma_etcd_options_check(&eo, why, sizeof why) != 0) {
      fprintf(stderr, "wagma-coordinator: bad etcd options: %s\n", why);
      return 2;
    }
  }
  if (parse_listen(listen, c.listen_host, sizeof c.listen_host, &c.listen_port)) {
    fprintf(stderr, "wagma-coordinator: --listen must be HOST:PORT\n");
    return 2;
  }
  if (wagma_keys_init(&c.keys, prefix)) {
    fprintf(stderr, "wagma-coordinator: bad --prefix %s (must start with '/')\n", prefix);
    return 2;
  }
  if (token_file) {
    if (read_token(token_file, c.token, sizeof c.token) || !c.token[0]) {
      fprintf(stderr, "wagma-coordinator: cannot read a token from %s\n", token_file);
      return 2;
    }
  } else if (getenv("WAGMA_TOKEN")) {
    /* Trimmed as a token file is (a secret mounted into the variable often ends in a
     * newline, which no client sends); set but empty, or too long, is a misconfiguration,
     * never "no token". */
    const char *env = getenv("WAGMA_TOKEN");
    size_t n = strlen(env);
    while (n && (env[n - 1] == '\n' || env[n - 1] == '\r' || env[n - 1] == ' '))
      n--;
    if (n == 0 || n >= sizeof c.token) {
      fprintf(stderr,
              "wagma-coordinator: WAGMA_TOKEN is set but %s; unset it to run without "
              "a token\n",
              n == 0 ? "empty" : "too long");
      return 2;
    }
    memcpy(c.token, env, n);
    c.token[n] = '\0';
  }
  c.log = log_stderr;
  c.log_user = c.id;

  /* Signals are taken synchronously by the main thread; every thread inherits the mask. */
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  snprintf(ping_key, sizeof ping_key, "%s/", c.keys.prefix); /* a user's role may read it */
  eo.log_fn = c.log;
  eo.log_user = c.log_user;
  if (wagma_etcd_open(&eo, &c.etcd)) {
    fprintf(stderr, "wagma-coordinator: bad --etcd %s\n", endpoints);
    return 2;
  }
  if ((rc = wait_for_etcd(&c, endpoints, etcd_startup_timeout, &sigs)) != 0) {
    wagma_etcd_close(c.etcd);
    return rc < 0 ? 0 : rc;
  }
  rc = 1;
  if (wg_metrics_create(&c.metrics))
    goto out;
  int listen_fd = -1;
  if (wg_http_bind(&c, &listen_fd))
    goto out;
  char address[96];
  snprintf(address, sizeof address, "%s:%d", c.listen_host, c.listen_port);
  if (wg_election_start(c.etcd, &c.keys, c.id, address, c.lease_ttl_s, c.log, c.log_user,
                        &c.election)) {
    close(listen_fd);
    goto out;
  }
  if (wg_scheduler_start(&c, &c.scheduler)) {
    close(listen_fd);
    goto out;
  }
  /* The read cache and the event hub (it publishes into the hub, so the hub comes first). */
  if (c.read_cache && (wg_hub_create(&c, &c.hub) || wg_cache_start(&c, &c.cache))) {
    close(listen_fd);
    goto out;
  }
  /* Last: handlers see every part set. */
  if (wg_http_start(&c, listen_fd, &http))
    goto out;
  wg_logf(c.log, c.log_user, WAGMA_LOG_INFO,
          "listening on http://%s (web view http://%s/ui/), etcd %s (tls %s, user %s), prefix %s, "
          "lease ttl %d s, auth %s, read cache %s",
          address, address, endpoints,
          etcd_ca || etcd_cert || strstr(endpoints, "https://") ? "on" : "off",
          etcd_user ? etcd_user : "none", c.keys.prefix, c.lease_ttl_s,
          c.token[0] ? "bearer" : "off",
          !c.read_cache            ? "off"
          : c.read_staleness_s > 0 ? "on (bounded staleness)"
                                   : "on (consistent)");
  for (;;) {
    int sig = 0;
    if (sigwait(&sigs, &sig) == 0 && (sig == SIGINT || sig == SIGTERM)) {
      wg_logf(c.log, c.log_user, WAGMA_LOG_INFO, "signal %d: shutting down", sig);
      break;
    }
  }
  rc = 0;
out:
  wg_http_stop(http);
  wg_cache_stop(c.cache);
  wg_hub_destroy(c.hub); /* after the server: its streams' completions call into the hub */
  wg_scheduler_stop(c.scheduler);
  wg_election_stop(c.election);
  wg_metrics_destroy(c.metrics);
  wagma_etcd_close(c.etcd);
  return rc;
}
