/* agent/main.c — wagma-agent: options, logging, signals, start and stop order.
 *
 * Threads: the main thread only waits for SIGINT / SIGTERM (blocked in every thread it
 * starts, taken with sigtimedwait; a thread started before main, e.g. OpenBLAS's, may take
 * one through a handler that only records it) and watches the control thread's startup; the
 * control thread (registry.c) talks to etcd; the runner thread (runner.c) runs the job's
 * program (the user's, or wagma-train for a built-in job). On a signal: ask both to stop,
 * revoke the lease first (the coordinator replans at once), then join the runner within a
 * deadline (it stops the program: SIGTERM, then SIGKILL after --program-grace) and exit. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "agent/agent.h"
#include "agent/gpu.h"
#include "agent/train/train.h"
#include "wagma/collective.h"
#include "wagma/etcd.h"
#include "wagma/log_internal.h"

int wg_agent_log_level = WAGMA_LOG_INFO;

/* SIGINT / SIGTERM taken by a thread other than main's sigtimedwait (a library's thread
 * created before main blocked them, e.g. OpenBLAS's pool): main sees it at its next tick. */
static volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

void wg_agent_log(void *user, int level, const char *msg) {
  static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  struct timespec ts;
  struct tm tm;
  char when[32];
  if (level < wg_agent_log_level)
    return;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  fprintf(stderr, "%s.%03ldZ %-5s wagma-agent[%s]: %s\n", when, ts.tv_nsec / 1000000L,
          names[level < 0   ? 0
                : level > 3 ? 3
                            : level],
          user ? (const char *)user : "-", msg);
}

int wg_shared_init(wg_shared_t *s) {
  memset(s, 0, sizeof *s);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* waits on it use CLOCK_MONOTONIC */
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  return 0;
}

void wg_shared_destroy(wg_shared_t *s) {
  OPENSSL_cleanse(s->secret, sizeof s->secret);
  wagma_plan_free(&s->plan);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
}

void wg_shared_request_stop(wg_shared_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int wg_shared_stopping(wg_shared_t *s) {
  pthread_mutex_lock(&s->mu);
  int stop = s->stop;
  pthread_mutex_unlock(&s->mu);
  return stop;
}

static void usage(FILE *f) {
  char etcd[2048]; /* the etcd options' lines, shared with wagma-coordinator */
  wagma_etcd_cli_usage(26, etcd, sizeof etcd);
  fprintf(f,
          "usage: wagma-agent --etcd HOST:PORT[,...] --name NAME --listen HOST:PORT [options]\n"
          "\n"
          "The per-node training daemon of wagma: registers under a lease, trains the job the\n"
          "coordinator assigns to it and averages its model with its peers (WAGMA-SGD).\n"
          "\n"
          "  --etcd ENDPOINTS        etcd client endpoints, comma separated (required)\n"
          "  --name NAME             agent name, unique in the cluster (required)\n"
          "  --listen HOST:PORT      address of the data plane (required), bound at start (a\n"
          "                          port in use fails the start, exit 2) and handed to the\n"
          "                          job's program; 0.0.0.0:PORT binds every interface\n"
          "  --advertise ADDR        address peers dial, registered and put in plans: HOST,\n"
          "                          HOST:PORT, [V6]:PORT or a bare IPv6 address (the port\n"
          "                          defaults to --listen's; default: the --listen address)\n"
          "  --prefix PREFIX         etcd key prefix (default /wagma)\n"
          "  --device cpu|cuda       device (default cpu). cuda is checked at startup: without\n"
          "                          a usable CUDA GPU, or in a build without the CUDA\n"
          "                          backend, the agent exits at once (status 3) and\n"
          "                          registers nothing\n"
          "  --gpu N                 the GPU to train on (--device cuda): the agent and its\n"
          "                          programs see it as device 0 (CUDA_VISIBLE_DEVICES set to\n"
          "                          it, or to the N-th entry of an inherited one); default:\n"
          "                          the first GPU visible\n"
          "  --transport tcp|nccl    how models are averaged (default tcp). nccl needs\n"
          "                          --device cuda and a build with NCCL (else exit 3);\n"
          "                          every agent of a job must use the same transport\n"
          "  --encrypt-data-plane    encrypt and authenticate every frame between agents\n"
          "                          (AES-256-GCM, keys from the epoch's secret; tcp only);\n"
          "                          every agent of a job must use the same setting\n"
          "  --capacity N            workers this agent can host (default 1)\n"
          "  --lease-ttl SECONDS     TTL of the agent's lease (default 5)\n"
          "%s"
          "  --listen-timeout S      how long a job's program retries a plan's communicator\n"
          "                          before it reports this agent unavailable for the job\n"
          "                          (default 10)\n"
          "  --data-dir DIR          Fashion-MNIST directory (default %s)\n"
          "  --checkpoint-root DIR   checkpoints are written and read only below DIR: a\n"
          "                          job's checkpoint.path is relative to it, and no\n"
          "                          symbolic link below it is followed (default: the\n"
          "                          current directory)\n"
          "  --synthetic-train N     samples of the synthetic training set (default 8192)\n"
          "  --synthetic-test N      samples of the synthetic test set (default 2048)\n"
          "  --eval-samples N        test samples of the periodic evaluation, 0 = all\n"
          "                          (default 2000; the final evaluation uses all)\n"
          "  --threads N             BLAS threads (default 1)\n"
          "  --connect-timeout S     mesh setup deadline of a new epoch (default 20)\n"
          "  --collective-timeout S  deadline of blocking collectives and barrier global\n"
          "                          rounds (default 5)\n"
          "  --round-deadline S      floor of a group round's deadline (default 1)\n"
          "  --progress-interval S   seconds between progress writes (default 1)\n"
          "  --linger S              a finished agent keeps serving its peers this long\n"
          "                          (default 60)\n"
          "  --slow-factor F         straggler: compute takes F times longer (default 1)\n"
          "  --sleep-prob P          transient imbalance: pause with probability P per step\n"
          "  --sleep-ms D            ... for D milliseconds (default 0)\n"
          "  --programs DIR          the programs this agent can launch: each executable\n"
          "                          file in DIR (named like a job name) is a program a job\n"
          "                          spec can name (docs/programs.md); registered at start\n"
          "  --program-env NAME=VALUE  set in every program's environment (repeatable, at\n"
          "                          most 32), e.g. PYTHONPATH or WAGMA_LIBRARY\n"
          "  --program-grace S       a program asked to stop gets SIGTERM, then SIGKILL S\n"
          "                          seconds later (default 10)\n"
          "  --program-connect-timeout S  a launched program that has not connected within S\n"
          "                          seconds is killed and reported (default 30)\n"

          "  --log-level LEVEL       debug, info, warn or error (default info)\n"
          "  --help                  this text\n"
          "\n"
          "Exit status: 0 stopped by SIGINT/SIGTERM; 1 failure; 2 usage error (bad flag or\n"
          "address); 3 --device cuda unusable; 4 etcd did not answer within\n"
          "--etcd-startup-timeout, or refused us (TLS, user or password); 5 the --name is\n"
          "held by a live agent.\n",
          etcd, WAGMA_FASHION_MNIST_DIR);
}

static int parse_double(const char *s, double lo, double hi, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= lo && v <= hi))
    return -1;
  *out = v;
  return 0;
}

static int valid_hostport(const char *s) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s || !colon[1])
    return 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  return *end == '\0' && port > 0 && port < 65536;
}

/* Completes o->advertise from --listen: empty = the --listen address; a host without a port
 * (a name, IPv4, a bare or bracketed IPv6) takes --listen's port. 0 or -1 (malformed). */
static int advertise_address(wg_agent_options_t *o) {
  const char *port = strrchr(o->listen, ':') + 1; /* --listen is valid HOST:PORT */
  const char *a = o->advertise;
  char out[2 * WAGMA_ADDRESS_MAX + 16];
  size_t colons = 0;
  for (const char *p = a; *p; p++)
    colons += *p == ':';
  if (!a[0])
    snprintf(out, sizeof out, "%s", o->listen);
  else if (a[0] == '[' && !strchr(a, ']'))
    return -1;
  else if (a[0] == '[' && strchr(a, ']')[1] == '\0')
    snprintf(out, sizeof out, "%s:%s", a, port); /* [V6] */
  else if (a[0] != '[' && colons > 1)
    snprintf(out, sizeof out, "[%s]:%s", a, port); /* a bare IPv6 address, e.g. $(POD_IP) */
  else if (colons == 0)
    snprintf(out, sizeof out, "%s:%s", a, port);
  else
    snprintf(out, sizeof out, "%s", a);
  if (strlen(out) >= sizeof o->advertise || !valid_hostport(out))
    return -1;
  memcpy(o->advertise, out, strlen(out) + 1);
  return 0;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(a, b);
}

/* --programs DIR: the executable regular files of DIR with a valid program name, sorted. A
 * file whose name is not one is skipped (logged); DIR must exist. 0 or -1 with why. */
static int scan_programs(wg_agent_options_t *o, char *why, size_t len) {
  DIR *d = opendir(o->programs_dir);
  if (!d) {
    snprintf(why, len, "--programs %s: %s", o->programs_dir, strerror(errno));
    return -1;
  }
  char real[PATH_MAX];
  if (!realpath(o->programs_dir, real)) {
    closedir(d);
    snprintf(why, len, "--programs %s: %s", o->programs_dir, strerror(errno));
    return -1;
  }
  snprintf(o->programs_dir, sizeof o->programs_dir, "%s", real);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode) ||
        faccessat(dirfd(d), e->d_name, X_OK, 0) != 0)
      continue;
    if (!wagma_program_name_valid(e->d_name)) {
      fprintf(stderr, "wagma-agent: --programs: skipping %s (not a valid program name)\n",
              e->d_name);
      continue;
    }
    if (o->nprograms == WAGMA_API_AGENT_PROGRAMS_MAX) {
      fprintf(stderr, "wagma-agent: --programs: more than %d programs; the rest are skipped\n",
              WAGMA_API_AGENT_PROGRAMS_MAX);
      break;
    }
    snprintf(o->programs[o->nprograms++], WAGMA_API_PROGRAM_NAME_MAX, "%.63s", e->d_name);
  }
  closedir(d);
  qsort(o->programs, (size_t)o->nprograms, sizeof o->programs[0], name_cmp);
  return 0;
}

/* wagma-train, the built-in trainer: in the directory of this agent's executable (both are
 * installed to the same bin directory, and built to the same build directory). 0 when it is
 * there and executable; o->trainer_path names it either way. */
static int trainer_path(wg_agent_options_t *o) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    snprintf(o->trainer_path, sizeof o->trainer_path, "wagma-train");
    return -1;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash)
    *slash = '\0';
  snprintf(o->trainer_path, sizeof o->trainer_path, "%.*s/wagma-train", PATH_MAX - 16, self);
  return access(o->trainer_path, X_OK) == 0 ? 0 : -1;
}

/* The data plane's socket is the agent's for its whole life: bound to --listen now (a port in
 * use is a start-up error, exit 2), inherited by the job's program, whose communicators accept
 * on it, so the address in etcd stays right across programs and epochs. */
static int bind_listen(wg_agent_options_t *o, char *why, size_t len) {
  char host[WAGMA_ADDRESS_MAX], port[16];
  const char *colon = strrchr(o->listen, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - o->listen), o->listen);
  snprintf(port, sizeof port, "%s", colon + 1);
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
  int g = getaddrinfo(host, port, &hints, &ai);
  if (g != 0) {
    snprintf(why, len, "--listen %s: %s", o->listen, gai_strerror(g));
    return -1;
  }
  int fd = -1, err = 0;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) {
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        err = errno;
        close(fd);
        fd = -1;
      }
    } else {
      err = errno;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    snprintf(why, len, "--listen %s: cannot bind: %s", o->listen, strerror(err));
    return -1;
  }
  o->listen_fd = fd;
  return 0;
}

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "wagma-agent: " __VA_ARGS__);                                                  \
    fputc('\n', stderr);                                                                           \
    return 2;                                                                                      \
  } while (0)

static int parse_options(int argc, char **argv, wg_agent_options_t *o) {
  static const struct option longs[] = {
      {"etcd", required_argument, 0, WAGMA_ETCD_CLI_ENDPOINTS},
      {"name", required_argument, 0, 'n'},
      {"listen", required_argument, 0, 'l'},
      {"advertise", required_argument, 0, 'A'},
      {"prefix", required_argument, 0, 'p'},
      {"device", required_argument, 0, 'D'},
      {"transport", required_argument, 0, 'X'},
      {"gpu", required_argument, 0, 1011},
      {"encrypt-data-plane", no_argument, 0, 1006},
      {"capacity", required_argument, 0, 'c'},
      {"lease-ttl", required_argument, 0, 'L'},
      {"etcd-timeout-ms", required_argument, 0, WAGMA_ETCD_CLI_TIMEOUT_MS},
      {"etcd-startup-timeout", required_argument, 0, WAGMA_ETCD_CLI_STARTUP_TIMEOUT},
      {"etcd-cacert", required_argument, 0, WAGMA_ETCD_CLI_CACERT},
      {"etcd-cert", required_argument, 0, WAGMA_ETCD_CLI_CERT},
      {"etcd-key", required_argument, 0, WAGMA_ETCD_CLI_KEY},
      {"etcd-user", required_argument, 0, WAGMA_ETCD_CLI_USER},
      {"etcd-password-file", required_argument, 0, WAGMA_ETCD_CLI_PASSWORD_FILE},
      {"listen-timeout", required_argument, 0, 'B'},
      {"data-dir", required_argument, 0, 'd'},
      {"checkpoint-root", required_argument, 0, 'K'},
      {"synthetic-train", required_argument, 0, 'S'},
      {"synthetic-test", required_argument, 0, 'T'},
      {"eval-samples", required_argument, 0, 'V'},
      {"threads", required_argument, 0, 't'},
      {"connect-timeout", required_argument, 0, 'C'},
      {"collective-timeout", required_argument, 0, 'G'},
      {"round-deadline", required_argument, 0, 'R'},
      {"progress-interval", required_argument, 0, 'P'},
      {"linger", required_argument, 0, 'g'},
      {"slow-factor", required_argument, 0, 'f'},
      {"sleep-prob", required_argument, 0, 'b'},
      {"sleep-ms", required_argument, 0, 'm'},
      {"log-level", required_argument, 0, 'v'},
      {"programs", required_argument, 0, 1007},
      {"program-env", required_argument, 0, 1008},
      {"program-grace", required_argument, 0, 1009},
      {"program-connect-timeout", required_argument, 0, 1010},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  double v;
  int c;
  memset(o, 0, sizeof *o);
  wagma_etcd_cli_init(&o->etcd);
  o->checkpoint_root.fd = -1;
  snprintf(o->prefix, sizeof o->prefix, "/wagma");
  o->capacity = 1;
  o->gpu = -1;
  o->lease_ttl_s = 5;
  o->listen_timeout_s = 10;
  o->slow_factor = 1.0;
  o->synthetic_train = 8192;
  o->synthetic_test = 2048;
  o->eval_samples = 2000;
  o->threads = 1;
  o->connect_timeout_s = 20;
  o->collective_timeout_s = 5;
  o->round_deadline_s = 1;
  o->progress_interval_s = 1;
  o->linger_s = 60;
  o->log_level = WAGMA_LOG_INFO;
  o->program_grace_s = 10;
  o->program_connect_timeout_s = 30;
  o->listen_fd = -1;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (c) {
    case 'n':
      if (!optarg[0] || strlen(optarg) >= sizeof o->name || strpbrk(optarg, "/ \t"))
        FAIL("--name must be 1-63 characters of [A-Za-z0-9._-]");
      snprintf(o->name, sizeof o->name, "%s", optarg);
      break;
    case 'l':
      if (strlen(optarg) >= sizeof o->listen || !valid_hostport(optarg))
        FAIL("--listen must be HOST:PORT with a port in 1..65535");
      snprintf(o->listen, sizeof o->listen, "%s", optarg);
      break;
    case 'A':
      if (strlen(optarg) >= sizeof o->advertise - 8)
        FAIL("--advertise is too long");
      snprintf(o->advertise, sizeof o->advertise, "%s", optarg);
      break;
    case 'p':
      if (optarg[0] != '/' || strlen(optarg) >= sizeof o->prefix)
        FAIL("--prefix must start with '/'");
      snprintf(o->prefix, sizeof o->prefix, "%s", optarg);
      break;
    case 'D':
      if (strcmp(optarg, "cpu") == 0)
        o->device_cuda = 0;
      else if (strcmp(optarg, "cuda") == 0)
        o->device_cuda = 1;
      else
        FAIL("--device must be cpu or cuda");
      break;
    case 'X':
      if (strcmp(optarg, "tcp") == 0)
        o->transport_nccl = 0;
      else if (strcmp(optarg, "nccl") == 0)
        o->transport_nccl = 1;
      else
        FAIL("--transport must be tcp or nccl");
      break;
    case 1006: o->encrypt_data_plane = 1; break;
    case 1011:
      if (parse_double(optarg, 0, WG_GPU_MAX, &v) || v != (int)v)
        FAIL("--gpu must be an integer 0..%d", WG_GPU_MAX);
      o->gpu = (int)v;
      break;
    case 'c':
      if (parse_double(optarg, 1, 1024, &v))
        FAIL("--capacity must be 1..1024");
      o->capacity = (int)v;
      break;
    case 'L':
      if (parse_double(optarg, 1, 3600, &v))
        FAIL("--lease-ttl must be 1..3600 seconds");
      o->lease_ttl_s = (int)v;
      break;
    case 'B':
      if (parse_double(optarg, 0, 3600, &o->listen_timeout_s))
        FAIL("--listen-timeout must be 0..3600 seconds");
      break;
    case 'd':
      if (strlen(optarg) >= sizeof o->data_dir)
        FAIL("--data-dir too long");
      snprintf(o->data_dir, sizeof o->data_dir, "%s", optarg);
      break;
    case 'K':
      if (!optarg[0] || strlen(optarg) >= sizeof o->checkpoint_root_arg)
        FAIL("--checkpoint-root must be a directory (1..%zu characters)",
             sizeof o->checkpoint_root_arg - 1);
      snprintf(o->checkpoint_root_arg, sizeof o->checkpoint_root_arg, "%s", optarg);
      break;
    case 'S':
      if (parse_double(optarg, 16, 1e7, &v))
        FAIL("--synthetic-train must be 16..10000000");
      o->synthetic_train = (size_t)v;
      break;
    case 'T':
      if (parse_double(optarg, 16, 1e7, &v))
        FAIL("--synthetic-test must be 16..10000000");
      o->synthetic_test = (size_t)v;
      break;
    case 'V':
      if (parse_double(optarg, 0, 1e7, &v))
        FAIL("--eval-samples must be 0..10000000");
      o->eval_samples = (size_t)v;
      break;
    case 't':
      if (parse_double(optarg, 1, 256, &v))
        FAIL("--threads must be 1..256");
      o->threads = (int)v;
      break;
    case 'C':
      if (parse_double(optarg, 0.1, 3600, &o->connect_timeout_s))
        FAIL("--connect-timeout must be 0.1..3600 seconds");
      break;
    case 'G':
      if (parse_double(optarg, 0.1, 3600, &o->collective_timeout_s))
        FAIL("--collective-timeout must be 0.1..3600 seconds");
      break;
    case 'R':
      if (parse_double(optarg, 0.01, 600, &o->round_deadline_s))
        FAIL("--round-deadline must be 0.01..600 seconds");
      break;
    case 'P':
      if (parse_double(optarg, 0.05, 600, &o->progress_interval_s))
        FAIL("--progress-interval must be 0.05..600 seconds");
      break;
    case 'g':
      if (parse_double(optarg, 0, 86400, &o->linger_s))
        FAIL("--linger must be 0..86400 seconds");
      break;
    case 'f':
      if (parse_double(optarg, 1, 1000, &o->slow_factor))
        FAIL("--slow-factor must be 1..1000");
      break;
    case 'b':
      if (parse_double(optarg, 0, 1, &o->sleep_prob))
        FAIL("--sleep-prob must be 0..1");
      break;
    case 'm':
      if (parse_double(optarg, 0, 600000, &o->sleep_ms))
        FAIL("--sleep-ms must be 0..600000");
      break;
    case 'v':
      if (strcmp(optarg, "debug") == 0)
        o->log_level = WAGMA_LOG_DEBUG;
      else if (strcmp(optarg, "info") == 0)
        o->log_level = WAGMA_LOG_INFO;
      else if (strcmp(optarg, "warn") == 0)
        o->log_level = WAGMA_LOG_WARN;
      else if (strcmp(optarg, "error") == 0)
        o->log_level = WAGMA_LOG_ERROR;
      else
        FAIL("--log-level must be debug, info, warn or error");
      break;
    case 1007:
      if (!optarg[0] || strlen(optarg) >= sizeof o->programs_dir)
        FAIL("--programs must be a directory (1..%zu characters)", sizeof o->programs_dir - 1);
      snprintf(o->programs_dir, sizeof o->programs_dir, "%s", optarg);
      break;
    case 1008: {
      const char *eq = strchr(optarg, '=');
      if (!eq || eq == optarg || strlen(optarg) >= 1100)
        FAIL("--program-env must be NAME=VALUE (at most 1100 characters)");
      if (o->nprogram_env >= (int)(sizeof o->program_env / sizeof *o->program_env))
        FAIL("--program-env: at most %zu", sizeof o->program_env / sizeof *o->program_env);
      o->program_env[o->nprogram_env++] = optarg;
      break;
    }
    case 1009:
      if (parse_double(optarg, 0, 3600, &o->program_grace_s))
        FAIL("--program-grace must be 0..3600 seconds");
      break;
    case 1010:
      if (parse_double(optarg, 0.1, 3600, &o->program_connect_timeout_s))
        FAIL("--program-connect-timeout must be 0.1..3600 seconds");
      break;
    case 'h': usage(stdout); return 1;
    default: {
      char why[512];
      int r = wagma_etcd_cli_option(&o->etcd, c, optarg, why, sizeof why);
      if (r < 0)
        FAIL("%s", why);
      if (r == 0) { /* getopt said why */
        usage(stderr);
        return 2;
      }
    }
    }
  }
  if (optind < argc)
    FAIL("unexpected argument %s", argv[optind]);
  if (o->listen[0] && advertise_address(o) != 0)
    FAIL("--advertise must be HOST, HOST:PORT, [V6]:PORT or a bare IPv6 address (got '%s')",
         o->advertise);
  if (!o->etcd.endpoints || !o->name[0] || !o->listen[0]) {
    usage(stderr);
    FAIL("--etcd, --name and --listen are required");
  }
#ifndef WAGMA_AGENT_NCCL_ON_CPU /* wagma-agent-fakenccl, a test build over tests/fake_nccl */
  if (o->transport_nccl && !o->device_cuda)
    FAIL("--transport nccl needs --device cuda (NCCL averages GPU buffers)");
#endif
#ifndef WAGMA_AGENT_NCCL_ON_CPU
  if (o->gpu >= 0 && !o->device_cuda)
    FAIL("--gpu needs --device cuda");
#endif
  if (o->gpu >= 0) { /* GPU N becomes device 0 of this process and of its programs, before
                        any CUDA call (the checks below, the launcher's environment) */
    char why[256];
    if (wg_gpu_visible_devices(getenv("CUDA_VISIBLE_DEVICES"), o->gpu, o->gpu_devices,
                               sizeof o->gpu_devices, why, sizeof why) != 0)
      FAIL("%s", why);
    if (setenv("CUDA_VISIBLE_DEVICES", o->gpu_devices, 1) != 0)
      FAIL("--gpu %d: cannot set CUDA_VISIBLE_DEVICES", o->gpu);
  }
  if (o->transport_nccl && o->encrypt_data_plane)
    FAIL("--encrypt-data-plane needs --transport tcp (NCCL moves payloads unencrypted)");
  {
    char why[1024];
    if (wagma_etcd_cli_finish(&o->etcd, why, sizeof why) != 0)
      FAIL("%s", why);
  }
  {
    char why[PATH_MAX + 128];
    if (wg_ckroot_open(o->checkpoint_root_arg, &o->checkpoint_root, why, sizeof why) != 0)
      FAIL("%s", why);
  }
  if (trainer_path(o) != 0)
    FAIL("no executable %s beside this agent's binary: built-in jobs train in it", o->trainer_path);
  {
    char why[PATH_MAX + 128];
    if (o->programs_dir[0] && scan_programs(o, why, sizeof why) != 0)
      FAIL("%s", why);
    if (bind_listen(o, why, sizeof why) != 0)
      FAIL("%s", why);
  }
  return 0;
}

int main(int argc, char **argv) {
  static wg_agent_options_t opt;
  wg_shared_t shared;
  wg_control_t *control = NULL;
  wg_runner_t *runner = NULL;
  sigset_t sigs;
  int rc = 1;

  int p = parse_options(argc, argv, &opt);
  if (p)
    return p == 1 ? 0 : p;
  wg_agent_log_level = opt.log_level;
  if (opt.device_cuda) { /* before anything is registered: a node that cannot train leaves */
    char why[512] = "";
    int e = wagma_backend_probe("cuda", why, sizeof why);
    if (e) {
      if (opt.gpu >= 0)
        fprintf(stderr,
                "wagma-agent: --device cuda --gpu %d (CUDA_VISIBLE_DEVICES=%s): %s (%s); not "
                "registering\n",
                opt.gpu, opt.gpu_devices, why, wagma_strerror(e));
      else
        fprintf(stderr, "wagma-agent: --device cuda: %s (%s); not registering\n", why,
                wagma_strerror(e));
      return 3;
    }
  }
  if (opt.transport_nccl) { /* the same: NCCL in this build, and a device for it */
    char why[512] = "";
    int e = wagma_comm_transport_check(WAGMA_TRANSPORT_NCCL, 0, why, sizeof why);
    if (e) {
      fprintf(stderr, "wagma-agent: --transport nccl: %s (%s); not registering\n", why,
              wagma_strerror(e));
      return 3;
    }
  }

  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  struct sigaction sa = {.sa_handler = on_stop_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  wg_shared_init(&shared);
  char why[512];
  if (wg_control_start(&opt, &shared, &control, why, sizeof why) != 0) {
    fprintf(stderr, "wagma-agent[%s]: %s\n", opt.name, why);
    goto out;
  }
  if (wg_runner_start(&opt, &shared, &runner) != 0)
    goto out;
  wg_logf(wg_agent_log, opt.name, WAGMA_LOG_INFO,
          "started: pid %d, listen %s, etcd %s (tls %s, user %s), prefix %s, checkpoint root %s, "
          "slow factor %.2f, sleep %.2f x %.0f ms",
          (int)getpid(), opt.listen, opt.etcd.endpoints,
          wagma_etcd_cli_tls(&opt.etcd) ? "on" : "off",
          opt.etcd.username ? opt.etcd.username : "none", opt.prefix, opt.checkpoint_root.path,
          opt.slow_factor, opt.sleep_prob, opt.sleep_ms);
  if (opt.gpu >= 0)
    wg_logf(wg_agent_log, opt.name, WAGMA_LOG_INFO,
            "GPU %d: CUDA_VISIBLE_DEVICES=%s for this agent and its programs", opt.gpu,
            opt.gpu_devices);
  /* The main thread stays in sigtimedwait (so that it, not a thread of a library that was
   * started with signals unblocked, takes SIGINT / SIGTERM) and watches the startup: etcd
   * unreachable for --etcd-startup-timeout, or the name held by a live agent, ends the
   * process with its exit status (docs/agent.md). */
  int starting = 1;
  for (;;) {
    struct timespec tick = {0, 100 * 1000000L};
    int sig = sigtimedwait(&sigs, NULL, &tick);
    if (sig <= 0)
      sig = g_stop_signal;
    if (sig == SIGINT || sig == SIGTERM) {
      wg_logf(wg_agent_log, opt.name, WAGMA_LOG_INFO, "signal %d: leaving", sig);
      break;
    }
    if (starting && (starting = wg_control_state(control, why, sizeof why)) < 0) {
      rc = starting == WAGMA_EUNAVAIL || starting == WAGMA_ETIMEDOUT || starting == WAGMA_EPERM
               ? WAGMA_ETCD_EXIT_STARTUP
           : starting == WAGMA_EEXIST ? 5
                                      : 1;
      fprintf(stderr, "wagma-agent[%s]: %s\n", opt.name, why);
      goto out;
    }
  }
  rc = 0;
out:
  wg_shared_request_stop(&shared);
  wg_control_stop(control); /* revokes the lease */
  if (runner && wg_runner_join(runner, 30) != 0) {
    wg_logf(wg_agent_log, opt.name, WAGMA_LOG_WARN, "runner did not stop in 30 s; exiting");
    _exit(rc);
  }
  wg_shared_destroy(&shared);
  wg_ckroot_close(&opt.checkpoint_root);
  wg_logf(wg_agent_log, opt.name, WAGMA_LOG_INFO, "stopped");
  return rc;
}
