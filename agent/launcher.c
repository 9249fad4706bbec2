/* agent/launcher.c — the job's program on this agent: the user's, or wagma-train for a
 * built-in job (launcher.h, docs/programs.md).
 *
 * Owns: the local socket the program connects to (in a private directory made at start,
 * removed at the end), the program's process (its own group), its connection, the pipes of
 * its stdout and stderr with their partial lines and the last lines of stderr, and copies of
 * the newest plan and its secret until the program has them. Threads: none of its own; every
 * call comes from the runner thread, which polls the descriptors here with short timeouts.
 * What the program reports goes to the control thread through wg_shared_t (under its mutex).
 *
 * Faults (docs/programs.md "Failures"): a program that does not connect within
 * --program-connect-timeout, sends something that is not the protocol, or exits before it
 * reported "done" is killed (its group) and its member reports "failed" with the reason and the
 * last lines of its stderr; the agent itself stays up. */
#define _GNU_SOURCE /* pipe2, accept4 */
#include "agent/launcher.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "proto.h"
#include "wagma/log_internal.h"

#define TAIL_LINES 6 /* lines of stderr kept for a failure's reason */
#define LINE_MAX_LOG 1000

typedef struct out_pipe {
  int fd;
  char line[LINE_MAX_LOG + 1];
  size_t len;
  int is_err;
} out_pipe_t;

struct wg_launcher {
  const wg_agent_options_t *opt;
  wg_shared_t *shared;
  char dir[256];  /* private directory of the socket */
  char path[300]; /* the socket's path */
  int server;     /* listening AF_UNIX socket */

  char job[WAGMA_NAME_MAX];
  pid_t pid; /* 0 = no program */
  double started_at;
  int conn; /* the program's connection, -1 = none yet */
  wg_proto_buf_t rbuf;
  int hello;         /* its hello came: config sent */
  int restarts;      /* of this job's program on this agent */
  int ended;         /* the program of this job ended (reported); not launched again */
  int reported_done; /* it said done (or failed): an exit after that is its normal end */
  out_pipe_t out[2];
  char tail[TAIL_LINES][200];
  int ntail, tail_next;

  int have_plan;
  wagma_plan_t plan; /* the newest plan of the job */
  uint8_t secret[WAGMA_API_SECRET_LEN];
  size_t secret_len;
  int have_ck;
  wg_checkpoint_rec_t ck; /* the job's checkpoint record with the newest plan */
  uint64_t sent_epoch;    /* the newest plan's epoch the program has */
};

/* The built-in trainer's restarts (a user's program has the spec's program.max_restarts). */
#define TRAINER_RESTARTS 3

/* What runs for cfg: the user's program, or wagma-train for a built-in job. */
static const char *what_runs(const wg_job_config_t *cfg) {
  return cfg->program.name[0] ? cfg->program.name : "wagma-train";
}

static int max_restarts(const wg_job_config_t *cfg) {
  return cfg->program.name[0] ? cfg->program.max_restarts : TRAINER_RESTARTS;
}

#define LLOG(l, level, ...) wg_logf(wg_agent_log, (void *)(l)->opt->name, level, __VA_ARGS__)

int wg_launcher_new(const wg_agent_options_t *opt, wg_shared_t *shared, wg_launcher_t **out) {
  *out = NULL;
  wg_launcher_t *l = calloc(1, sizeof *l);
  if (!l)
    return WAGMA_ENOMEM;
  l->opt = opt;
  l->shared = shared;
  l->server = l->conn = -1;
  l->out[0].fd = l->out[1].fd = -1;
  l->out[1].is_err = 1;
  const char *tmp = getenv("TMPDIR");
  snprintf(l->dir, sizeof l->dir, "%s/wagma-agent.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(l->dir)) {
    LLOG(l, WAGMA_LOG_ERROR, "cannot make the programs' socket directory %s: %s", l->dir,
         strerror(errno));
    free(l);
    return WAGMA_EIO;
  }
  snprintf(l->path, sizeof l->path, "%s/agent.sock", l->dir);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int e = WAGMA_EIO;
  if (strlen(l->path) >= sizeof sa.sun_path)
    goto fail;
  memcpy(sa.sun_path, l->path, strlen(l->path));
  l->server = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->server < 0 || bind(l->server, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(l->server, 4) != 0)
    goto fail;
  *out = l;
  return 0;
fail:
  LLOG(l, WAGMA_LOG_ERROR, "cannot listen on %s: %s", l->path, strerror(errno));
  wg_launcher_free(l);
  return e;
}

int wg_launcher_running(const wg_launcher_t *l) {
  return l && l->pid > 0;
}

/* ---- reports to the control thread -------------------------------------------------------- */

static void share(wg_launcher_t *l, const wagma_progress_t *p, const char *job) {
  pthread_mutex_lock(&l->shared->mu);
  wg_progress_snap_from_progress(&l->shared->progress, p, job);
  l->shared->progress_dirty = 1;
  if (p->state != WAGMA_PROGRESS_RUNNING)
    l->shared->progress_urgent = 1;
  pthread_mutex_unlock(&l->shared->mu);
}

/* The program's member fails the job: "failed" with why and the last lines of stderr. */
static void report_failed(wg_launcher_t *l, const char *why) {
  wagma_progress_t p;
  char tail[600] = "";
  size_t n = 0;
  for (int i = 0; i < l->ntail; i++) {
    const char *line = l->tail[(l->tail_next - l->ntail + i + TAIL_LINES) % TAIL_LINES];
    n += (size_t)snprintf(tail + n, n < sizeof tail ? sizeof tail - n : 0, "%s%s", i ? " | " : "",
                          line);
    if (n >= sizeof tail)
      break;
  }
  wagma_progress_init(&p);
  p.state = WAGMA_PROGRESS_FAILED;
  p.epoch = l->sent_epoch;
  pthread_mutex_lock(&l->shared->mu);
  p.iteration = strcmp(l->shared->progress.job, l->job) == 0 ? l->shared->progress.iteration : 0;
  pthread_mutex_unlock(&l->shared->mu);
  p.time = wg_wall();
  snprintf(p.error, sizeof p.error, "%s%s%.*s", why, l->ntail ? "; stderr: " : "",
           (int)(sizeof p.error / 2), tail);
  LLOG(l, WAGMA_LOG_ERROR, "job %s: %s", l->job, p.error);
  share(l, &p, l->job);
  l->reported_done = 1;
}

/* ---- the process -------------------------------------------------------------------------- */

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/* Keeps a line of stderr for a failure's reason, and logs every line. */
static void emit_line(wg_launcher_t *l, out_pipe_t *o) {
  o->line[o->len] = '\0';
  for (char *c = o->line; *c; c++)
    if ((unsigned char)*c < 0x20 && *c != '\t')
      *c = '?';
  LLOG(l, WAGMA_LOG_INFO, "job %s [%s %d %s] %s", l->job, l->job[0] ? "program" : "-", (int)l->pid,
       o->is_err ? "stderr" : "stdout", o->line);
  if (o->is_err) {
    snprintf(l->tail[l->tail_next], sizeof l->tail[0], "%.199s", o->line);
    l->tail_next = (l->tail_next + 1) % TAIL_LINES;
    if (l->ntail < TAIL_LINES)
      l->ntail++;
  }
  o->len = 0;
}

static void drain(wg_launcher_t *l, out_pipe_t *o) {
  char buf[4096];
  for (;;) {
    ssize_t n = o->fd >= 0 ? read(o->fd, buf, sizeof buf) : 0;
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        if (o->len)
          emit_line(l, o);
        close_fd(&o->fd);
      }
      return;
    }
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == '\n' || o->len == LINE_MAX_LOG)
        emit_line(l, o);
      if (buf[i] != '\n')
        o->line[o->len++] = buf[i];
    }
  }
}

static void kill_group(wg_launcher_t *l, int sig) {
  if (l->pid > 0) {
    kill(-l->pid, sig); /* its group, which it leads */
    kill(l->pid, sig);  /* (in case it left the group) */
  }
}

/* Reaps the program when it exited: 1 (and the reason in why) or 0 while it runs. */
static int reap(wg_launcher_t *l, char *why, size_t len) {
  int st;
  if (l->pid <= 0)
    return 0;
  pid_t r = waitpid(l->pid, &st, WNOHANG);
  if (r != l->pid)
    return 0;
  drain(l, &l->out[0]);
  drain(l, &l->out[1]);
  if (WIFEXITED(st))
    snprintf(why, len, "exited with status %d", WEXITSTATUS(st));
  else
    snprintf(why, len, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  l->pid = 0;
  close_fd(&l->conn);
  close_fd(&l->out[0].fd);
  close_fd(&l->out[1].fd);
  wg_proto_buf_free(&l->rbuf);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 1 : 2;
}

/* The child's environment: nothing of the agent's but the few a program needs. */
static int build_env(wg_launcher_t *l, const wg_job_config_t *cfg, char env[][1200], char **envp,
                     int max) {
  int n = 0;
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  snprintf(env[n++], 1200, "PATH=/usr/local/bin:/usr/bin:/bin");
  snprintf(env[n++], 1200, "LANG=C.UTF-8");
  snprintf(env[n++], 1200, "HOME=%s", l->dir);
  snprintf(env[n++], 1200, "PYTHONUNBUFFERED=1");
  snprintf(env[n++], 1200, "%s=%s", WG_PROTO_ENV_SOCKET, l->path);
  snprintf(env[n++], 1200, "%s=%d", WG_PROTO_ENV_LISTEN_FD, l->opt->listen_fd);
  snprintf(env[n++], 1200, "WAGMA_JOB=%s", cfg->job);
  snprintf(env[n++], 1200, "WAGMA_AGENT=%s", l->opt->name);
  if (cvd)
    snprintf(env[n++], 1200, "CUDA_VISIBLE_DEVICES=%s", cvd);
  for (int i = 0; i < l->opt->nprogram_env && n < max - 1; i++)
    snprintf(env[n++], 1200, "%s", l->opt->program_env[i]);
  for (int i = 0; i < n; i++)
    envp[i] = env[i];
  envp[n] = NULL;
  return n;
}

/* wagma-train's argv: the agent's options that shape its training (docs/programs.md). */
static void trainer_argv(const wg_launcher_t *l, char args[][PATH_MAX + 32], char **argv) {
  const wg_agent_options_t *o = l->opt;
  int n = 0;
  argv[n++] = (char *)o->trainer_path;
#define ARG(...) (snprintf(args[n], PATH_MAX + 32, __VA_ARGS__), argv[n] = args[n], n++)
  ARG("--device=%s", o->device_cuda ? "cuda" : "cpu");
  ARG("--checkpoint-root=%s", o->checkpoint_root.path);
  if (o->data_dir[0])
    ARG("--data-dir=%s", o->data_dir);
  ARG("--synthetic-train=%zu", o->synthetic_train);
  ARG("--synthetic-test=%zu", o->synthetic_test);
  ARG("--eval-samples=%zu", o->eval_samples);
  ARG("--threads=%d", o->threads);
  ARG("--slow-factor=%.17g", o->slow_factor);
  ARG("--sleep-prob=%.17g", o->sleep_prob);
  ARG("--sleep-ms=%.17g", o->sleep_ms);
  ARG("--log-level=%d", o->log_level);
  ARG("--listen-host=%s", o->listen); /* adpsgd's and the parameter server's endpoints */
  ARG("--round-deadline=%.17g", o->round_deadline_s);
#undef ARG
  argv[n] = NULL;
}

static int launch(wg_launcher_t *l, const wg_job_config_t *cfg) {
  char path[PATH_MAX + WAGMA_API_PROGRAM_NAME_MAX + 2];
  char *argv[WAGMA_API_PROGRAM_ARGS_MAX + 2];
  static char targs[16][PATH_MAX + 32];
  static char env[48][1200];
  char *envp[49];
  int outp[2] = {-1, -1}, errp[2] = {-1, -1};
  int builtin = !cfg->program.name[0];
  if (builtin) {
    snprintf(path, sizeof path, "%s", l->opt->trainer_path);
    trainer_argv(l, targs, argv);
  } else {
    snprintf(path, sizeof path, "%s/%s", l->opt->programs_dir, cfg->program.name);
    argv[0] = path;
    for (int i = 0; i < cfg->program.nargs; i++)
      argv[i + 1] = (char *)cfg->program.args[i];
    argv[cfg->program.nargs + 1] = NULL;
  }
  build_env(l, cfg, env, envp, 48);
  if (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0) {
    close_fd(&outp[0]), close_fd(&outp[1]), close_fd(&errp[0]), close_fd(&errp[1]);
    return WAGMA_EIO;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close_fd(&outp[0]), close_fd(&outp[1]), close_fd(&errp[0]), close_fd(&errp[1]);
    return WAGMA_EIO;
  }
  if (pid == 0) { /* the child: async-signal-safe calls only */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the agent (its launching thread) */
    if (getppid() != parent)
      _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the agent blocks SIGINT/SIGTERM in its threads */
    signal(SIGPIPE, SIG_DFL);
    dup2(outp[1], 1);
    dup2(errp[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0)
      dup2(devnull, 0);
    if (l->opt->listen_fd >= 0)
      fcntl(l->opt->listen_fd, F_SETFD, 0); /* inherited across exec */
    if (!builtin && chdir(l->opt->programs_dir) != 0)
      _exit(127);
    execve(path, argv, envp);
    _exit(127);
  }
  close(outp[1]);
  close(errp[1]);
  fcntl(outp[0], F_SETFL, O_NONBLOCK);
  fcntl(errp[0], F_SETFL, O_NONBLOCK);
  l->out[0].fd = outp[0];
  l->out[1].fd = errp[0];
  l->out[0].len = l->out[1].len = 0;
  l->pid = pid;
  l->started_at = wg_mono();
  l->hello = 0;
  l->sent_epoch = 0;
  l->ntail = l->tail_next = 0;
  LLOG(l, WAGMA_LOG_INFO, "job %s: launched program %s (pid %d, %d arguments)", cfg->job,
       what_runs(cfg), (int)pid, builtin ? 0 : cfg->program.nargs);
  return 0;
}

/* ---- the protocol --------------------------------------------------------------------------- */

static int send_json(wg_launcher_t *l, json_t *m) {
  int e = m ? wg_proto_send(l->conn, m, wg_mono() + 5.0) : WAGMA_ENOMEM;
  json_decref(m);
  return e;
}

static int send_config(wg_launcher_t *l, const wg_job_config_t *c) {
  json_t *m = json_pack(
      "{s:s,s:i,s:s,s:s,s:s,s:I,s:I,s:i,s:i,s:I,s:I,s:i,s:s,s:f,s:f,s:f,s:f,s:f,s:b,s:s,s:f}",
      "type", "config", "version", WG_PROTO_VERSION, "job", c->job, "agent", l->opt->name,
      "algorithm", wagma_algorithm_name(c->algorithm), "iterations", (json_int_t)c->iterations,
      "epochs", (json_int_t)c->epochs, "batch_size", c->batch_size, "workers", c->workers, "seed",
      (json_int_t)c->seed, "eval_every", (json_int_t)c->eval_every, "staleness_bound",
      c->staleness_bound, "device", wagma_device_name(c->device), "progress_interval",
      l->opt->progress_interval_s < 0.25 ? l->opt->progress_interval_s : 0.25, "connect_timeout",
      l->opt->connect_timeout_s, "round_deadline", l->opt->round_deadline_s, "collective_timeout",
      l->opt->collective_timeout_s, "linger", l->opt->linger_s, "encrypt",
      l->opt->encrypt_data_plane, "transport", l->opt->transport_nccl ? "nccl" : "tcp",
      "listen_timeout", l->opt->listen_timeout_s);
  json_t *spec = wagma_job_spec_to_value(&c->spec);
  if (m && (!spec || json_object_set_new(m, "spec", spec) != 0)) {
    json_decref(m);
    m = NULL;
  }
  return send_json(l, m);
}

static int send_plan(wg_launcher_t *l) {
  char *text = NULL, hex[2 * WAGMA_API_SECRET_LEN + 1] = "";
  if (wagma_plan_to_json(&l->plan, &text) != 0)
    return WAGMA_ENOMEM;
  json_t *p = json_loads(text, 0, NULL);
  free(text);
  for (size_t i = 0; i < l->secret_len; i++)
    snprintf(hex + 2 * i, 3, "%02x", l->secret[i]);
  json_t *m = p ? json_pack("{s:s,s:o,s:s}", "type", "plan", "plan", p, "secret", hex) : NULL;
  if (m && l->have_ck && l->ck.path[0] &&
      json_object_set_new(m, "checkpoint",
                          json_pack("{s:s,s:I}", "path", l->ck.path, "iteration",
                                    (json_int_t)l->ck.iteration)) != 0) {
    json_decref(m);
    m = NULL;
  }
  int e = send_json(l, m);
  OPENSSL_cleanse(hex, sizeof hex);
  if (e == 0)
    l->sent_epoch = l->plan.epoch;
  return e;
}

/* The program broke the protocol: killed, its member failed. */
static void protocol_fault(wg_launcher_t *l, const char *why) {
  char msg[300];
  snprintf(msg, sizeof msg, "program broke the protocol (%s): killed", why);
  kill_group(l, SIGKILL);
  close_fd(&l->conn);
  report_failed(l, msg);
}

/* The program saved a checkpoint: the control thread records it in etcd. */
static void on_checkpoint(wg_launcher_t *l, const wg_job_config_t *cfg,
                          const wg_proto_checkpoint_t *ck) {
  const char *problem = wg_ckroot_path_problem(ck->path);
  if (problem) {
    LLOG(l, WAGMA_LOG_WARN, "job %s: program's checkpoint %s not recorded: %s", cfg->job, ck->path,
         problem);
    return;
  }
  pthread_mutex_lock(&l->shared->mu);
  wg_checkpoint_rec_t *c = &l->shared->checkpoint_out;
  snprintf(c->job, sizeof c->job, "%s", cfg->job);
  snprintf(c->path, sizeof c->path, "%s", ck->path);
  c->iteration = ck->iteration;
  c->epoch = ck->epoch;
  l->shared->checkpoint_dirty = 1;
  pthread_mutex_unlock(&l->shared->mu);
}

static void on_message(wg_launcher_t *l, const wg_job_config_t *cfg, json_t *m) {
  wagma_progress_t p;
  wg_proto_checkpoint_t ck;
  char why[200];
  int kind = wg_proto_program_message(m, l->hello, &p, &ck, why, sizeof why);
  if (kind == WG_PROTO_HELLO) {
    l->hello = 1;
    if (send_config(l, cfg) != 0 || (l->have_plan && send_plan(l) != 0))
      protocol_fault(l, "it does not read its socket");
  } else if (kind == WG_PROTO_PROGRESS) {
    if (p.state != WAGMA_PROGRESS_RUNNING)
      l->reported_done = 1;
    share(l, &p, cfg->job);
  } else if (kind == WG_PROTO_CHECKPOINT) {
    on_checkpoint(l, cfg, &ck);
  } else {
    protocol_fault(l, why);
  }
}

/* The program died before it reported the job done and may restart: a new process, which
 * enters only plans newer than the current one; the member asks the coordinator for one in
 * which it is a joiner (progress "rejoin"), so that it gets the survivors' parameters and
 * optimizer state (docs/programs.md). */
static void restart(wg_launcher_t *l, const wg_job_config_t *cfg, const char *why) {
  l->restarts++;
  LLOG(l, WAGMA_LOG_WARN, "job %s: program %s %s; restarting it as a joiner (restart %d of %d)",
       cfg->job, what_runs(cfg), why, l->restarts, max_restarts(cfg));
  wagma_progress_t p;
  wagma_progress_init(&p);
  p.state = WAGMA_PROGRESS_RUNNING;
  p.epoch = l->plan.epoch;
  p.rejoin = l->plan.epoch;
  pthread_mutex_lock(&l->shared->mu);
  p.iteration = strcmp(l->shared->progress.job, l->job) == 0 ? l->shared->progress.iteration : 0;
  pthread_mutex_unlock(&l->shared->mu);
  p.time = wg_wall();
  snprintf(p.role, sizeof p.role, "worker");
  share(l, &p, cfg->job);
  l->ended = 0;
  if (launch(l, cfg) != 0) {
    char msg[300];
    snprintf(msg, sizeof msg, "cannot launch program %s again: %s", what_runs(cfg),
             strerror(errno));
    report_failed(l, msg);
    l->ended = 1;
    return;
  }
  l->sent_epoch = l->plan.epoch; /* launch() cleared it: only newer plans go to this one */
}

/* ---- the turn -------------------------------------------------------------------------------- */

static void new_plan(wg_launcher_t *l, const wagma_plan_t *plan, const uint8_t *secret,
                     size_t secret_len, const wg_checkpoint_rec_t *ck) {
  wagma_plan_t copy;
  if (wagma_plan_copy(&copy, plan) != 0)
    return;
  wagma_plan_free(&l->plan);
  l->plan = copy;
  l->have_plan = 1;
  OPENSSL_cleanse(l->secret, sizeof l->secret);
  l->secret_len = secret_len <= sizeof l->secret ? secret_len : 0;
  memcpy(l->secret, secret, l->secret_len);
  l->have_ck = ck != NULL;
  if (ck)
    l->ck = *ck;
}

static void forget_job(wg_launcher_t *l) {
  wagma_plan_free(&l->plan);
  l->have_plan = 0;
  l->have_ck = 0;
  OPENSSL_cleanse(l->secret, sizeof l->secret);
  l->secret_len = 0;
  l->ended = l->reported_done = l->restarts = 0;
  l->job[0] = '\0';
}

void wg_launcher_turn(wg_launcher_t *l, const wg_job_config_t *cfg, const wagma_plan_t *plan,
                      const uint8_t *secret, size_t secret_len, const wg_checkpoint_rec_t *ck,
                      double wait_s) {
  char why[300];
  if (strcmp(l->job, cfg->job) != 0) {
    wg_launcher_release(l, "another job");
    snprintf(l->job, sizeof l->job, "%s", cfg->job);
  }
  if (plan)
    new_plan(l, plan, secret, secret_len, ck);
  if (l->pid == 0 && !l->ended) {
    if (cfg->program.name[0] && !l->opt->programs_dir[0]) {
      report_failed(l, "this agent has no --programs directory");
      l->ended = 1;
    } else if (launch(l, cfg) != 0) {
      snprintf(why, sizeof why, "cannot launch program %s: %s", what_runs(cfg), strerror(errno));
      report_failed(l, why);
      l->ended = 1;
    }
  }
  if (l->pid > 0 && l->conn >= 0 && l->hello && l->have_plan && l->plan.epoch > l->sent_epoch &&
      send_plan(l) != 0)
    protocol_fault(l, "it does not read its socket");
  /* wait for what comes: the connection, a message, output */
  struct pollfd p[4];
  int n = 0, at_server = -1, at_conn = -1;
  if (l->pid > 0 && l->conn < 0) {
    at_server = n;
    p[n++] = (struct pollfd){.fd = l->server, .events = POLLIN};
  }
  if (l->conn >= 0) {
    at_conn = n;
    p[n++] = (struct pollfd){.fd = l->conn, .events = POLLIN};
  }
  for (int i = 0; i < 2; i++)
    if (l->out[i].fd >= 0)
      p[n++] = (struct pollfd){.fd = l->out[i].fd, .events = POLLIN};
  int ms = (int)(wait_s * 1000);
  if (n == 0) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
  } else if (poll(p, (nfds_t)n, ms) < 0 && errno != EINTR) {
    return;
  }
  drain(l, &l->out[0]);
  drain(l, &l->out[1]);
  if (at_server >= 0 && p[at_server].revents) {
    int c = accept4(l->server, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) {
      l->conn = c;
      wg_proto_buf_free(&l->rbuf);
    }
  }
  if (at_conn >= 0 && p[at_conn].revents && l->conn >= 0) {
    int r = wg_proto_buf_fill(&l->rbuf, l->conn);
    if (r == 0 || r == WAGMA_EIO) {
      close_fd(&l->conn); /* it closed: its exit (reaped below) tells the rest */
    } else if (r == WAGMA_EPROTO) {
      protocol_fault(l, "a frame above the size limit");
    } else {
      json_t *m;
      int t;
      while (l->conn >= 0 && (t = wg_proto_take(&l->rbuf, &m, why, sizeof why)) == 1) {
        on_message(l, cfg, m);
        json_decref(m);
      }
      if (l->conn >= 0 && t < 0)
        protocol_fault(l, why);
    }
  }
  if (l->pid > 0 && !l->hello && wg_mono() - l->started_at > l->opt->program_connect_timeout_s) {
    kill_group(l, SIGKILL);
    snprintf(why, sizeof why, "program %s did not connect within %.0f s: killed", what_runs(cfg),
             l->opt->program_connect_timeout_s);
    report_failed(l, why);
  }
  int how = reap(l, why, sizeof why);
  if (how) {
    l->ended = 1;
    if (!l->reported_done && l->restarts < max_restarts(cfg)) {
      restart(l, cfg, why);
    } else if (!l->reported_done) {
      char msg[500];
      snprintf(msg, sizeof msg, "program %.63s %.300s before it reported the job done%s",
               what_runs(cfg), why, l->restarts ? " (and after every restart)" : "");
      report_failed(l, msg);
    } else {
      LLOG(l, WAGMA_LOG_INFO, "job %s: program %s ended (%s)", cfg->job, what_runs(cfg), why);
    }
  }
}

void wg_launcher_release(wg_launcher_t *l, const char *why) {
  if (!l || (l->pid <= 0 && !l->job[0]))
    return; /* (called at every turn of a runner without a job) */
  if (l->pid <= 0) {
    forget_job(l); /* a later assignment to the same job launches anew */
    return;
  }
  char w[300];
  /* "stop" first: a program that reads it ends by itself (its finish, its own cleanup);
   * SIGTERM after half the grace period, SIGKILL after the whole of it */
  int connected =
      l->conn >= 0 && send_json(l, json_pack("{s:s,s:s}", "type", "stop", "reason", why)) == 0;
  double start = wg_mono(), deadline = start + l->opt->program_grace_s;
  double term_at = connected ? start + l->opt->program_grace_s / 2 : start;
  int termed = 0;
  while (l->pid > 0 && wg_mono() < deadline) {
    if (!termed && wg_mono() >= term_at) {
      kill_group(l, SIGTERM);
      termed = 1;
    }
    struct pollfd p[2];
    int n = 0;
    for (int i = 0; i < 2; i++)
      if (l->out[i].fd >= 0)
        p[n++] = (struct pollfd){.fd = l->out[i].fd, .events = POLLIN};
    poll(p, (nfds_t)n, 50);
    drain(l, &l->out[0]);
    drain(l, &l->out[1]);
    reap(l, w, sizeof w);
  }
  if (l->pid > 0) {
    LLOG(l, WAGMA_LOG_WARN, "job %s: program %d still running %.0f s after stop: SIGKILL", l->job,
         (int)l->pid, l->opt->program_grace_s);
    kill_group(l, SIGKILL);
    while (l->pid > 0 && reap(l, w, sizeof w) == 0) {
      struct timespec ts = {0, 10000000L};
      nanosleep(&ts, NULL);
    }
  }
  LLOG(l, WAGMA_LOG_INFO, "job %s: program stopped (%s)", l->job, why);
  forget_job(l);
}

void wg_launcher_free(wg_launcher_t *l) {
  if (!l)
    return;
  wg_launcher_release(l, "the agent stops");
  forget_job(l);
  close_fd(&l->server);
  close_fd(&l->conn);
  wg_proto_buf_free(&l->rbuf);
  if (l->path[0])
    unlink(l->path);
  if (l->dir[0])
    rmdir(l->dir);
  free(l);
}
