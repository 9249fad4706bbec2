/* coordinator/main.c — wagma-coordinator: options, logging, signals, start and stop order.
 *
 * Options (parse_options): the etcd ones are the etcd library's (wagma_etcd_cli_*, shared
 * with wagma-agent), the rest are parsed here. Start: etcd handle (a malformed endpoint is a
 * usage error, exit 2) -> wait until etcd answers, at most --etcd-startup-timeout (else exit
 * 4; once running, etcd outages are survived) (open_etcd) -> metrics -> bind the REST socket
 * (resolves port 0) -> election (campaign thread) -> scheduler (reconcile thread) -> event
 * hub -> read cache (load, watch) -> REST server (start_all). Stop (SIGINT / SIGTERM, run):
 * REST server -> read cache -> hub -> scheduler -> election (revokes the lease so a follower
 * takes over at once) -> etcd (stop_all). The main thread only waits for a signal. */
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
  char etcd[2048]; /* the etcd options' lines, shared with wagma-agent */
  wagma_etcd_cli_usage(23, etcd, sizeof etcd);
  fprintf(f,
          "usage: wagma-coordinator --etcd HOST:PORT[,HOST:PORT...] [options]\n"
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
          "%s"
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
          "user or password).\n",
          etcd);
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

/* What the command line sets besides the fields of wg_coord_t (strings of argv). */
typedef struct coord_cli {
  const char *listen, *prefix, *token_file;
  wagma_etcd_cli_t etcd; /* --etcd and the --etcd-* options */
} coord_cli_t;

/* The defaults of every option; c->id = <hostname>-<pid>, the hostname's odd characters
 * replaced by '-'. */
static void defaults(wg_coord_t *c, coord_cli_t *o) {
  memset(c, 0, sizeof *c);
  c->max_body = 65536;
  c->lease_ttl_s = 5;
  c->threads = 4;
  c->quarantine_s = 300;
  c->read_cache = 1;
  c->sse_heartbeat_s = WG_SSE_HEARTBEAT_S;
  c->sse_client_buffer = WG_SSE_CLIENT_BUFFER;
  c->sse_max_clients = WG_SSE_MAX_CLIENTS;
  *o = (coord_cli_t){.listen = "127.0.0.1:8080", .prefix = "/wagma"};
  wagma_etcd_cli_init(&o->etcd);
  char host[48] = "coordinator";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  for (char *q = host; *q; q++)
    if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
          *q == '-' || *q == '.' || *q == '_'))
      *q = '-';
  snprintf(c->id, sizeof c->id, "%s-%d", host, (int)getpid());
}

/* A decimal integer within lo..hi (strtoll; "" is not one). 0 or -1. */
static int parse_int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!s[0] || *end || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "wagma-coordinator: " __VA_ARGS__);                                            \
    fputc('\n', stderr);                                                                           \
    return 2;                                                                                      \
  } while (0)

/* Applies one option of getopt_long (the etcd ones through wagma_etcd_cli_option). -1 = go
 * on, or the exit status: 0 after --help, 2 for a bad option (said on stderr). */
static int apply_option(wg_coord_t *c, coord_cli_t *o, int opt, const char *arg) {
  long long v;
  switch (opt) {
  case 'l': o->listen = arg; break;
  case 'p': o->prefix = arg; break;
  case 't': o->token_file = arg; break;
  case 'i':
    if (!wagma_api_name_valid(arg))
      FAIL("--id must be 1-63 characters of [A-Za-z0-9._-]");
    snprintf(c->id, sizeof c->id, "%s", arg);
    break;
  case 'L':
    if (parse_int(arg, 1, 3600, &v))
      FAIL("--lease-ttl must be 1..3600 seconds");
    c->lease_ttl_s = (int)v;
    break;
  case 'b':
    if (parse_int(arg, 256, 64LL * 1024 * 1024, &v))
      FAIL("--max-body must be 256..67108864");
    c->max_body = (size_t)v;
    break;
  case 'T':
    if (parse_int(arg, 1, 256, &v))
      FAIL("--threads must be 1..256");
    c->threads = (int)v;
    break;
  case 'Q':
    if (parse_int(arg, 0, 86400 * 7, &v))
      FAIL("--quarantine must be 0..604800 seconds");
    c->quarantine_s = (int)v;
    break;
  case 'R':
    if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0)
      FAIL("--read-cache must be on or off");
    c->read_cache = strcmp(arg, "on") == 0;
    break;
  case 'S':
    if (parse_int(arg, 0, 60000, &v))
      FAIL("--read-staleness-ms must be 0..60000");
    c->read_staleness_s = (double)v / 1000.0;
    break;
  case 'H':
    if (parse_int(arg, 10, 600000, &v))
      FAIL("--sse-heartbeat-ms must be 10..600000");
    c->sse_heartbeat_s = (double)v / 1000.0;
    break;
  case 'B':
    if (parse_int(arg, 4096, 1LL << 30, &v))
      FAIL("--sse-client-buffer must be 4096..1073741824");
    c->sse_client_buffer = (size_t)v;
    break;
  case 'M':
    if (parse_int(arg, 0, WG_HTTP_MAX_CONNECTIONS, &v))
      FAIL("--sse-max-clients must be 0..%d", WG_HTTP_MAX_CONNECTIONS);
    c->sse_max_clients = (int)v;
    break;
  case 'v':
    if (strcmp(arg, "debug") == 0)
      g_log_level = WAGMA_LOG_DEBUG;
    else if (strcmp(arg, "info") == 0)
      g_log_level = WAGMA_LOG_INFO;
    else if (strcmp(arg, "warn") == 0)
      g_log_level = WAGMA_LOG_WARN;
    else if (strcmp(arg, "error") == 0)
      g_log_level = WAGMA_LOG_ERROR;
    else
      FAIL("--log-level must be debug, info, warn or error");
    break;
  case 'h': usage(stdout); return 0;
  default: {
    char err[4096];
    int r = wagma_etcd_cli_option(&o->etcd, opt, arg, err, sizeof err);
    if (r < 0)
      FAIL("%s", err);
    if (r == 0) { /* getopt said why */
      usage(stderr);
      return 2;
    }
  }
  }
  return -1;
}

/* The token from --token-file, else from $WAGMA_TOKEN (trimmed as a token file is: a secret
 * mounted into the variable often ends in a newline, which no client sends; set but empty,
 * or too long, is a misconfiguration, never "no token"), else none. -1 or 2. */
static int load_token(wg_coord_t *c, const char *token_file) {
  const char *env = getenv("WAGMA_TOKEN");
  if (token_file) {
    if (read_token(token_file, c->token, sizeof c->token) || !c->token[0])
      FAIL("cannot read a token from %s", token_file);
  } else if (env) {
    size_t n = strlen(env);
    while (n && (env[n - 1] == '\n' || env[n - 1] == '\r' || env[n - 1] == ' '))
      n--;
    if (n == 0 || n >= sizeof c->token)
      FAIL("WAGMA_TOKEN is set but %s; unset it to run without a token",
           n == 0 ? "empty" : "too long");
    memcpy(c->token, env, n);
    c->token[n] = '\0';
  }
  return -1;
}

/* The command line into *c and *o. -1 = start, or the exit status (0 after --help, 2 for a
 * usage error, said on stderr). */
static int parse_options(int argc, char **argv, wg_coord_t *c, coord_cli_t *o) {
  static const struct option longopts[] = {
      {"listen", required_argument, 0, 'l'},
      {"etcd", required_argument, 0, WAGMA_ETCD_CLI_ENDPOINTS},
      {"prefix", required_argument, 0, 'p'},
      {"token-file", required_argument, 0, 't'},
      {"id", required_argument, 0, 'i'},
      {"lease-ttl", required_argument, 0, 'L'},
      {"max-body", required_argument, 0, 'b'},
      {"threads", required_argument, 0, 'T'},
      {"log-level", required_argument, 0, 'v'},
      {"etcd-timeout-ms", required_argument, 0, WAGMA_ETCD_CLI_TIMEOUT_MS},
      {"etcd-startup-timeout", required_argument, 0, WAGMA_ETCD_CLI_STARTUP_TIMEOUT},
      {"etcd-cacert", required_argument, 0, WAGMA_ETCD_CLI_CACERT},
      {"etcd-cert", required_argument, 0, WAGMA_ETCD_CLI_CERT},
      {"etcd-key", required_argument, 0, WAGMA_ETCD_CLI_KEY},
      {"etcd-user", required_argument, 0, WAGMA_ETCD_CLI_USER},
      {"etcd-password-file", required_argument, 0, WAGMA_ETCD_CLI_PASSWORD_FILE},
      {"quarantine", required_argument, 0, 'Q'},
      {"read-cache", required_argument, 0, 'R'},
      {"read-staleness-ms", required_argument, 0, 'S'},
      {"sse-heartbeat-ms", required_argument, 0, 'H'},
      {"sse-client-buffer", required_argument, 0, 'B'},
      {"sse-max-clients", required_argument, 0, 'M'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  char err[1024];
  int opt, rc;
  defaults(c, o);
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1)
    if ((rc = apply_option(c, o, opt, optarg)) >= 0)
      return rc;
  if (optind < argc) {
    fprintf(stderr, "wagma-coordinator: unexpected argument %s\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (!o->etcd.endpoints) {
    fprintf(stderr, "wagma-coordinator: --etcd is required\n");
    usage(stderr);
    return 2;
  }
  if (wagma_etcd_cli_finish(&o->etcd, err, sizeof err) != 0)
    FAIL("%s", err);
  if (parse_listen(o->listen, c->listen_host, sizeof c->listen_host, &c->listen_port))
    FAIL("--listen must be HOST:PORT");
  if (wagma_keys_init(&c->keys, o->prefix))
    FAIL("bad --prefix %s (must start with '/')", o->prefix);
  if ((rc = load_token(c, o->token_file)) >= 0)
    return rc;
  c->log = log_stderr;
  c->log_user = c->id;
  return -1;
}

/* Asked by the start-up wait between tries: SIGINT or SIGTERM pending (blocked in every
 * thread) stops it; the signal is taken. */
static int signal_pending(void *user) {
  const sigset_t *sigs = user;
  sigset_t pending;
  int sig;
  if (sigpending(&pending) != 0 ||
      (sigismember(&pending, SIGINT) != 1 && sigismember(&pending, SIGTERM) != 1))
    return 0;
  sigwait(sigs, &sig); /* consume it */
  return 1;
}

/* Opens the etcd handle and waits until etcd answers (wagma_etcd_wait_ready). -1 = go on
 * (c->etcd open), or the exit status: 2 (endpoints gRPC refuses), WAGMA_ETCD_EXIT_STARTUP
 * (no answer within --etcd-startup-timeout, or refused us), 0 (a signal meanwhile); then
 * c->etcd is closed. */
static int open_etcd(wg_coord_t *c, const coord_cli_t *o, const sigset_t *sigs) {
  char ping_key[sizeof c->keys.prefix + 2], err[4096];
  snprintf(ping_key, sizeof ping_key, "%s/", c->keys.prefix); /* a user's role may read it */
  wagma_etcd_options_t eo = {.log_fn = c->log, .log_user = c->log_user, .ping_key = ping_key};
  wagma_etcd_cli_options(&o->etcd, &eo);
  if (wagma_etcd_open(&eo, &c->etcd))
    FAIL("bad --etcd %s", o->etcd.endpoints);
  int e = wagma_etcd_wait_ready(c->etcd, o->etcd.endpoints, o->etcd.startup_timeout_s,
                                signal_pending, (void *)sigs, err, sizeof err);
  if (e == 0)
    return -1;
  wagma_etcd_close(c->etcd);
  c->etcd = NULL;
  if (e == WAGMA_ECANCELED)
    return 0;
  fprintf(stderr, "wagma-coordinator: %s\n", err);
  return WAGMA_ETCD_EXIT_STARTUP;
}

/* Starts the parts after etcd, in order: metrics, the REST socket (resolves port 0),
 * election, scheduler, hub and read cache, REST server (last: handlers see every part set).
 * 0, or -1 with what started left for stop_all. */
static int start_all(wg_coord_t *c, struct MHD_Daemon **http, char *address, size_t len) {
  int listen_fd = -1;
  if (wg_metrics_create(&c->metrics) || wg_http_bind(c, &listen_fd))
    return -1;
  snprintf(address, len, "%s:%d", c->listen_host, c->listen_port);
  if (wg_election_start(c->etcd, &c->keys, c->id, address, c->lease_ttl_s, c->log, c->log_user,
                        &c->election) ||
      wg_scheduler_start(c, &c->scheduler) ||
      /* the cache publishes into the hub, so the hub comes first */
      (c->read_cache && (wg_hub_create(c, &c->hub) || wg_cache_start(c, &c->cache)))) {
    close(listen_fd);
    return -1;
  }
  return wg_http_start(c, listen_fd, http) ? -1 : 0;
}

/* Stops what started, in reverse: REST server, read cache, hub (after the server: its
 * streams' completions call into the hub), scheduler, election (revokes the lease so a
 * follower takes over at once), metrics, etcd. Each part may be absent. */
static void stop_all(wg_coord_t *c, struct MHD_Daemon *http) {
  wg_http_stop(http);
  wg_cache_stop(c->cache);
  wg_hub_destroy(c->hub);
  wg_scheduler_stop(c->scheduler);
  wg_election_stop(c->election);
  wg_metrics_destroy(c->metrics);
  wagma_etcd_close(c->etcd);
}

/* Says what runs, then waits for SIGINT or SIGTERM. */
static void run(wg_coord_t *c, const coord_cli_t *o, const char *address, const sigset_t *sigs) {
  wg_logf(c->log, c->log_user, WAGMA_LOG_INFO,
          "listening on http://%s (web view http://%s/ui/), etcd %s (tls %s, user %s), prefix %s, "
          "lease ttl %d s, auth %s, read cache %s",
          address, address, o->etcd.endpoints, wagma_etcd_cli_tls(&o->etcd) ? "on" : "off",
          o->etcd.username ? o->etcd.username : "none", c->keys.prefix, c->lease_ttl_s,
          c->token[0] ? "bearer" : "off",
          !c->read_cache            ? "off"
          : c->read_staleness_s > 0 ? "on (bounded staleness)"
                                    : "on (consistent)");
  for (;;) {
    int sig = 0;
    if (sigwait(sigs, &sig) == 0 && (sig == SIGINT || sig == SIGTERM)) {
      wg_logf(c->log, c->log_user, WAGMA_LOG_INFO, "signal %d: shutting down", sig);
      return;
    }
  }
}

int main(int argc, char **argv) {
  wg_coord_t c;
  coord_cli_t o;
  struct MHD_Daemon *http = NULL;
  char address[96];
  sigset_t sigs;
  int rc;
  if ((rc = parse_options(argc, argv, &c, &o)) >= 0)
    return rc;
  /* Signals are taken synchronously by the main thread; every thread inherits the mask. */
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);
  if ((rc = open_etcd(&c, &o, &sigs)) >= 0)
    return rc;
  rc = start_all(&c, &http, address, sizeof address);
  if (rc == 0)
    run(&c, &o, address, &sigs);
  stop_all(&c, http);
  return rc == 0 ? 0 : 1;
}
