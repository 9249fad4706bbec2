/* worker/worker.c — libwagma (wagma/worker.h): a training process's side of a wagma job.
 *
 * Owns: the agent's socket (WAGMA_AGENT_SOCKET) and the control thread that reads it (the job's
 * configuration, the newest plan with its data-plane secret, stop); the communicator of the
 * current epoch and its opening sync buffer; the progress reports (sent by the training
 * thread). The data plane's listening socket is the agent's (WAGMA_LISTEN_FD, inherited): every
 * epoch's communicator accepts on a dup of it and never binds.
 *
 * Threads: the training thread makes every wagma_worker_* call and is the only one that sends
 * on the socket or touches the communicator's buffers; the control thread only reads the
 * socket, keeps the newest plan and the stop flag under mu, and aborts the communicator
 * (wagma_comm_abort, under mu) when a newer plan or a stop makes its rounds moot. Every wait of
 * the training thread has a deadline (the plan wait below, the communicator's own).
 *
 * Epochs follow the agent's built-in trainer (agent/runner.c, docs/agent.md): a member enters
 * an epoch at an iteration boundary with the opening global sync, a weighted average of
 * [parameters | optimizer state] where a member without the job's model (a joiner, a fresh
 * process) weighs 0; when every weight is 0 the epoch is a fresh start and each member keeps
 * the model it drew from the job's seed. */
#define _GNU_SOURCE /* pipe2 */
#include "wagma/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cuda_stage.h"
#include "proto.h"
#include "worker_internal.h"
#include "wagma/api.h"
#include "wagma/clock_internal.h"
#include "wagma/collective.h"
#include "wagma/fingerprint_internal.h"
#include "wagma/log_internal.h"

#define CONFIG_WAIT_S 30.0  /* open: the agent's configuration after hello */
#define PLAN_WAIT_S 600.0   /* a member out of every plan waits this long for one */
#define SEND_DEADLINE_S 5.0 /* one report to the agent */

/* ---- errors and logging ---------------------------------------------------------------- */

int wg_worker_fail(wagma_worker_t *w, int e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int wg_worker_fail(wagma_worker_t *w, int e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->err, sizeof w->err, fmt, ap);
  va_end(ap);
  return e;
}

#define WLOG(w, level, ...) wg_logf((w)->log, (w)->log_user, level, __VA_ARGS__)

const char *wagma_worker_last_error(const wagma_worker_t *w) {
  return w ? w->err : "no worker";
}

/* ---- device buffers: the host mirrors, staged on the caller's stream --------------------- */

/* The device parameters into the mirror (waits for the caller's stream): 0 on host buffers. */
int wg_worker_params_in(wagma_worker_t *w) {
  char why[256];
  if (!w->device)
    return 0;
  int e = wg_cuda_to_host(&w->cuda, w->params, w->dparams, w->n, w->stream, why, sizeof why);
  return e ? wg_worker_fail(w, e, "the device parameters: %s", why) : 0;
}

/* The mirror back to the device parameters (queued on the caller's stream). */
int wg_worker_params_out(wagma_worker_t *w) {
  char why[256];
  if (!w->device)
    return 0;
  int e = wg_cuda_to_device(&w->cuda, w->dparams, w->params, w->n, w->stream, why, sizeof why);
  return e ? wg_worker_fail(w, e, "the device parameters: %s", why) : 0;
}

/* A failed data-plane operation, at most every 2 s (the round goes on without it). */
void wg_worker_warn(wagma_worker_t *w, const char *what, int e) {
  if (wg_mono() - w->last_warn < 2.0)
    return;
  w->last_warn = wg_mono();
  WLOG(w, WAGMA_LOG_WARN, "job %s epoch %llu: %s: %s (%s)", w->cfg.job,
       (unsigned long long)w->epoch, what, wagma_strerror(e),
       w->comm ? wagma_comm_last_error(w->comm) : "no communicator");
}

/* ---- the control thread ------------------------------------------------------------------- */

static void set_stop(wagma_worker_t *w, const char *why) {
  if (!w->stop)
    snprintf(w->stop_reason, sizeof w->stop_reason, "%s", why);
  w->stop = 1;
  wagma_comm_abort(w->comm);
  pthread_cond_broadcast(&w->cv);
}

static int hex_secret(const char *hex, uint8_t *out, size_t *len) {
  size_t n = strlen(hex);
  *len = 0;
  if (n == 0)
    return 0;
  if (n != 2 * WAGMA_API_SECRET_LEN)
    return -1;
  for (size_t i = 0; i < WAGMA_API_SECRET_LEN; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1)
      return -1;
    out[i] = (uint8_t)v;
  }
  *len = WAGMA_API_SECRET_LEN;
  return 0;
}

static void copy_str(char *dst, size_t len, const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  snprintf(dst, len, "%s", s ? s : "");
}

static double num_or(const json_t *o, const char *key, double dflt) {
  const json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : dflt;
}

static void on_config(wagma_worker_t *w, const json_t *m) {
  wagma_worker_config_t *c = &w->cfg;
  memset(c, 0, sizeof *c);
  copy_str(c->job, sizeof c->job, m, "job");
  copy_str(c->agent, sizeof c->agent, m, "agent");
  copy_str(c->algorithm, sizeof c->algorithm, m, "algorithm");
  copy_str(c->global_sync, sizeof c->global_sync, m, "global_sync");
  copy_str(c->device, sizeof c->device, m, "device");
  copy_str(c->transport, sizeof c->transport, m, "transport");
  if (!c->transport[0])
    snprintf(c->transport, sizeof c->transport, "tcp");
  c->iterations = (uint64_t)num_or(m, "iterations", 0);
  c->epochs = (uint64_t)num_or(m, "epochs", 0);
  c->batch_size = (int)num_or(m, "batch_size", 0);
  c->workers = (int)num_or(m, "workers", 0);
  c->seed = (uint64_t)num_or(m, "seed", 0);
  c->eval_every = (uint64_t)num_or(m, "eval_every", 0);
  c->staleness_bound = (int)num_or(m, "staleness_bound", 1);
  c->group_size = (int)num_or(m, "group_size", 2);
  w->progress_interval = num_or(m, "progress_interval", 0.25);
  w->connect_timeout = num_or(m, "connect_timeout", 10);
  w->round_deadline = num_or(m, "round_deadline", 0);
  w->collective_timeout = num_or(m, "collective_timeout", 0);
  w->linger = num_or(m, "linger", 5);
  w->create_retry = num_or(m, "listen_timeout", 10); /* the agent's --listen-timeout */
  w->encrypt = json_is_true(json_object_get(m, "encrypt"));
  const json_t *spec = json_object_get(m, "spec");
  free(w->spec);
  w->spec = json_is_object(spec) ? json_dumps(spec, JSON_COMPACT) : NULL;
  const json_t *ck = json_object_get(spec, "checkpoint");
  w->ck_every = (uint64_t)num_or(ck, "every", 0);
  w->ck_dir = json_string_length(json_object_get(ck, "path")) > 0;
  w->have_config = 1;
}

/* A plan message: the newest plan replaces an older one; the communicator of an older epoch
 * is aborted, so that a round blocked on it ends at once (the member moves to the new epoch at
 * its next step). */
static void on_plan(wagma_worker_t *w, const json_t *m) {
  char err[256];
  wagma_plan_t p;
  uint8_t secret[WAGMA_API_SECRET_LEN];
  size_t slen = 0;
  char *text = json_dumps(json_object_get(m, "plan"), JSON_COMPACT);
  const char *hex = json_string_value(json_object_get(m, "secret"));
  if (!text || wagma_plan_from_json(text, strlen(text), &p, err, sizeof err) != 0 ||
      hex_secret(hex ? hex : "", secret, &slen) != 0) {
    WLOG(w, WAGMA_LOG_ERROR, "agent sent a bad plan: %s", text ? err : "out of memory");
    free(text);
    return;
  }
  free(text);
  if (w->have_plan && p.epoch <= w->plan.epoch) {
    wagma_plan_free(&p);
    return;
  }
  wagma_plan_free(&w->plan);
  w->plan = p;
  w->have_plan = 1;
  memcpy(w->secret, secret, slen);
  w->secret_len = slen;
  const json_t *ck = json_object_get(m, "checkpoint");
  copy_str(w->ck_path, sizeof w->ck_path, ck, "path");
  w->ck_iteration = (uint64_t)num_or(ck, "iteration", 0);
  if (w->comm && p.epoch > w->epoch)
    wagma_comm_abort(w->comm);
  pthread_cond_broadcast(&w->cv);
}

static void *control_main(void *arg) {
  wagma_worker_t *w = arg;
  wg_proto_buf_t b = {0};
  char why[200];
  for (;;) {
    struct pollfd p[2] = {{.fd = w->fd, .events = POLLIN}, {.fd = w->wake[0], .events = POLLIN}};
    if (poll(p, 2, 1000) < 0 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (!p[0].revents)
      continue;
    int r = wg_proto_buf_fill(&b, w->fd);
    if (r == WAGMA_EBUSY)
      continue;
    pthread_mutex_lock(&w->mu);
    if (r <= 0) {
      set_stop(w, r == 0 ? "the agent closed the connection" : "the agent's connection failed");
      pthread_mutex_unlock(&w->mu);
      break;
    }
    json_t *m;
    int t;
    while ((t = wg_proto_take(&b, &m, why, sizeof why)) == 1) {
      const char *type = wg_proto_type(m);
      if (strcmp(type, "config") == 0)
        on_config(w, m);
      else if (strcmp(type, "plan") == 0)
        on_plan(w, m);
      else if (strcmp(type, "stop") == 0)
        set_stop(w, json_string_value(json_object_get(m, "reason"))
                        ? json_string_value(json_object_get(m, "reason"))
                        : "the agent said stop");
      /* unknown types: a newer agent's; ignored */
      json_decref(m);
      pthread_cond_broadcast(&w->cv);
    }
    if (t < 0) {
      WLOG(w, WAGMA_LOG_ERROR, "the agent's stream is corrupt: %s", why);
      set_stop(w, "the agent's stream is corrupt");
      pthread_mutex_unlock(&w->mu);
      break;
    }
    pthread_mutex_unlock(&w->mu);
  }
  wg_proto_buf_free(&b);
  return NULL;
}

/* Waits (mu held) until pred(w) or the deadline (wg_mono seconds): 1 when pred holds. */
static int wait_until(wagma_worker_t *w, int (*pred)(wagma_worker_t *), double deadline) {
  while (!pred(w)) {
    double left = deadline - wg_mono();
    if (left <= 0)
      return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double step = left > 0.5 ? 0.5 : left;
    long ns = ts.tv_nsec + (long)(step * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  return 1;
}

static int config_or_stop(wagma_worker_t *w) {
  return w->have_config || w->stop;
}

/* ---- reports to the agent ----------------------------------------------------------------- */

static int send_msg(wagma_worker_t *w, json_t *m) {
  int e = m ? wg_proto_send(w->fd, m, wg_mono() + SEND_DEADLINE_S) : WAGMA_ENOMEM;
  json_decref(m);
  return e;
}

/* The members of the current epoch this one cannot reach on the data plane, the longest
 * cut off first (the first WAGMA_API_UNREACHABLE_MAX of them; all counted). */
static void unreachable_peers(wagma_worker_t *w, wagma_progress_t *p) {
  for (int r = 0; r < w->cur.nranks; r++) {
    double secs;
    if (!wagma_comm_peer_unreachable(w->comm, r, &secs))
      continue;
    p->unreachable_total++;
    int at = p->nunreachable;
    while (at > 0 && p->unreachable[at - 1].seconds < secs)
      at--;
    if (at >= WAGMA_API_UNREACHABLE_MAX)
      continue;
    int n = p->nunreachable < WAGMA_API_UNREACHABLE_MAX ? p->nunreachable : p->nunreachable - 1;
    memmove(&p->unreachable[at + 1], &p->unreachable[at],
            (size_t)(n - at) * sizeof *p->unreachable);
    p->unreachable[at].rank = r;
    p->unreachable[at].seconds = secs;
    if (p->nunreachable < WAGMA_API_UNREACHABLE_MAX)
      p->nunreachable++;
  }
}

/* A progress report (state running/done/failed/unavailable) with what this member knows. */
static int report(wagma_worker_t *w, wagma_progress_state_t state, const char *error) {
  wagma_progress_t p;
  wagma_comm_counters_t cc;
  wagma_progress_init(&p);
  memset(&cc, 0, sizeof cc);
  if (w->comm)
    wagma_comm_counters(w->comm, &cc);
  p.state = state;
  p.epoch = w->epoch;
  p.iteration = w->iteration;
  p.loss = w->loss;
  p.accuracy = w->accuracy;
  p.step_time = isfinite(w->step_ema) ? w->step_ema : 0;
  /* wagma: a member that averages alone (its peers cut off or gone) falls behind the others'
   * models by the rounds since it last averaged with one of them */
  p.staleness = w->staleness > w->alone ? w->staleness : w->alone;
  p.rounds_activated = w->base.rounds_activated + cc.rounds_activated;
  p.rounds_joined = w->base.rounds_joined + cc.rounds_joined;
  p.rounds_left_out = w->base.rounds_left_out + cc.rounds_left_out;
  p.rounds_skipped = w->base.rounds_skipped + cc.rounds_skipped;
  p.time = wg_wall();
  snprintf(p.role, sizeof p.role, "%s", w->role[0] ? w->role : "worker");
  p.rounds_activated += w->own_averaged; /* a program's own averagings (own.c) */
  p.rounds_joined += w->own_served;
  p.rounds_skipped += w->own_skipped;
  if (error)
    snprintf(p.error, sizeof p.error, "%s", error);
  if (state == WAGMA_PROGRESS_DONE && w->nfp) {
    p.nfingerprint = w->nfp;
    memcpy(p.fingerprint, w->fp, sizeof p.fingerprint);
  } else if (state == WAGMA_PROGRESS_DONE && w->params) {
    wg_fingerprint(w->params, w->n, p.fingerprint, &p.nfingerprint);
  }
  if (w->comm)
    unreachable_peers(w, &p);
  if (strcmp(w->cfg.algorithm, "wagma") == 0 && w->epoch && w->iteration > w->cur.start_round) {
    p.has_round = 1;
    p.round = w->iteration - 1;
    p.round_global = w->round_global;
    p.ngroup = w->ngroup;
    memcpy(p.group, w->group, sizeof p.group);
  }
  w->last_report = wg_mono();
  return send_msg(
      w, json_pack("{s:s,s:o}", "type", "progress", "progress", wagma_progress_to_value(&p)));
}

/* ---- epochs ----------------------------------------------------------------------------- */

void wg_worker_close_comm(wagma_worker_t *w) {
  if (!w->comm)
    return;
  wagma_comm_counters_t cc;
  wagma_comm_counters(w->comm, &cc);
  w->base.rounds_activated += cc.rounds_activated;
  w->base.rounds_joined += cc.rounds_joined;
  w->base.rounds_left_out += cc.rounds_left_out;
  w->base.rounds_skipped += cc.rounds_skipped;
  pthread_mutex_lock(&w->mu);
  wagma_comm_t *c = w->comm;
  w->comm = NULL;
  pthread_mutex_unlock(&w->mu);
  wagma_comm_destroy(c);
}

static int superseded(void *user) {
  wagma_worker_t *w = user;
  pthread_mutex_lock(&w->mu);
  int gone = w->stop || (w->have_plan && w->plan.epoch > w->epoch);
  pthread_mutex_unlock(&w->mu);
  return gone;
}

/* The opening sync of the epoch just created: [params | state] averaged, weighted 0 by a
 * member without the job's model (runner.c's rules, docs/agent.md). plan_joiner: the plan marks
 * this member a joiner and has survivors. *how names what this member was, for the log. A
 * joiner that gets no model fails (it must not train from its seed); a survivor's failed sync
 * is a warning (it keeps its model). 0, WAGMA_ECANCELED, or the joiner's failure. */
static int opening_sync(wagma_worker_t *w, int plan_joiner, const char **how, float *weight_out) {
  size_t ns = w->st.size ? w->st.size(w->st_user) : 0, total = w->n + ns;
  if (total > w->sync_cap) {
    float *b = realloc(w->sync_buf, total * sizeof(float));
    if (!b)
      return wg_worker_fail(w, WAGMA_ENOMEM, "out of memory for the opening sync (%zu floats)",
                            total);
    w->sync_buf = b;
    w->sync_cap = total;
  }
  int e = wg_worker_params_in(w);
  if (e)
    return e;
  memcpy(w->sync_buf, w->params, w->n * sizeof(float));
  if (ns)
    w->st.save(w->st_user, w->sync_buf + w->n);
  int seeded = !plan_joiner && !w->has_model; /* a survivor's slot, no model: the seed's */
  float weight = plan_joiner || seeded ? 0.0f : 1.0f;
  *weight_out = weight;
  int fresh = 0;
  e = wagma_comm_average(w->comm, w->sync_buf, total, weight);
  if (e == WAGMA_EINVAL && weight == 0.0f) {
    /* nobody had a model: a fresh start (every member drew the same seed), unless a member
     * the plan counts as a survivor is out of reach: then a joiner got no model */
    int lost = 0;
    for (int i = 0; plan_joiner && i < w->cur.nranks; i++)
      lost |= !w->cur.members[i].joiner && !wagma_comm_peer_alive(w->comm, i);
    if (!lost) {
      fresh = 1; /* sync_buf is still this member's (seed) state */
      e = 0;
    }
  }
  if (e == WAGMA_ECANCELED)
    return wg_worker_fail(w, e, "the opening sync of epoch %llu was superseded",
                          (unsigned long long)w->epoch);
  if (e && plan_joiner)
    return wg_worker_fail(
        w, e,
        "the joining sync of epoch %llu brought no model of the job (%s): not training "
        "from the seed",
        (unsigned long long)w->epoch, wagma_strerror(e));
  if (e) {
    wg_worker_warn(w, "global sync", e);
  } else if (!fresh) {
    memcpy(w->params, w->sync_buf, w->n * sizeof(float));
    if (ns)
      w->st.load(w->st_user, w->sync_buf + w->n);
    if ((e = wg_worker_params_out(w)))
      return e;
  }
  w->joined = e == 0 && !fresh && weight == 0.0f;
  w->has_model = 1;
  w->fresh = fresh;
  *how = plan_joiner ? "joiner"
         : fresh     ? "fresh start"
         : seeded    ? "survivor without a model"
                     : "survivor";
  return 0;
}

/* A restart of the whole job (no member has its model) from the checkpoint the agent holds:
 * every member of the fresh start loads the same file (runner.c's rule). 1 when loaded. */
static int restore_checkpoint(wagma_worker_t *w, int plan_joiner) {
  char path[WAGMA_API_CHECKPOINT_PATH_MAX];
  pthread_mutex_lock(&w->mu);
  snprintf(path, sizeof path, "%s", w->ck_path);
  pthread_mutex_unlock(&w->mu);
  if (w->has_model || plan_joiner || !w->restore || !path[0])
    return 0;
  uint64_t it = 0;
  if (w->restore(w->restore_user, path, &it) != 0) {
    WLOG(w, WAGMA_LOG_WARN, "job %s: cannot resume from checkpoint %s; starting from the seed",
         w->cfg.job, path);
    return 0;
  }
  WLOG(w, WAGMA_LOG_INFO, "job %s: resumed from checkpoint %s (iteration %llu)", w->cfg.job, path,
       (unsigned long long)it);
  w->has_model = 1;
  return 1;
}

static int member_of_plan(wagma_worker_t *w) {
  return w->stop || (w->have_plan && w->plan.epoch > w->epoch &&
                     wagma_plan_rank_of(&w->plan, w->cfg.agent) >= 0);
}

/* Enters the newest plan that lists this agent (waiting for one up to PLAN_WAIT_S): the
 * communicator on the agent's listening socket, the opening sync, the iteration. 0, or
 * WAGMA_ECANCELED after stop, or the failure. */
static int enter_epoch(wagma_worker_t *w) {
  double create_since = 0;
  for (;;) {
    wg_worker_close_comm(w);
    pthread_mutex_lock(&w->mu);
    int ok = wait_until(w, member_of_plan, wg_mono() + PLAN_WAIT_S);
    if (w->stop) {
      pthread_mutex_unlock(&w->mu);
      return wg_worker_fail(w, WAGMA_ECANCELED, "stopped: %s", w->stop_reason);
    }
    if (!ok) {
      pthread_mutex_unlock(&w->mu);
      return wg_worker_fail(w, WAGMA_ETIMEDOUT, "no plan listed agent %s for %.0f s", w->cfg.agent,
                            PLAN_WAIT_S);
    }
    wagma_plan_free(&w->cur);
    int e = wagma_plan_copy(&w->cur, &w->plan);
    uint8_t secret[WAGMA_API_SECRET_LEN];
    size_t slen = w->secret_len;
    memcpy(secret, w->secret, slen);
    pthread_mutex_unlock(&w->mu);
    if (e)
      return wg_worker_fail(w, e, "out of memory copying the plan");
    w->epoch = w->cur.epoch;
    w->rank = wagma_plan_rank_of(&w->cur, w->cfg.agent);
    if (slen == 0) {
      /* the coordinator writes every plan's secret with the plan: none means the agent could
       * not read it, and an unauthenticated data plane is open to anyone (runner.c's rule) */
      wg_worker_fail(
          w, WAGMA_EPERM,
          "no data-plane secret for epoch %llu (unreadable in etcd): not running the data "
          "plane unauthenticated",
          (unsigned long long)w->epoch);
      report(w, WAGMA_PROGRESS_UNAVAILABLE, w->err);
      continue;
    }
    w->cfg.group_size = w->cur.group_size;
    snprintf(w->cfg.global_sync, sizeof w->cfg.global_sync, "%s",
             w->cur.global_sync == WAGMA_GLOBAL_WAIT_AVOIDING ? "wait-avoiding" : "barrier");
    wagma_comm_options_t co;
    wagma_comm_options_init(&co);
    co.plan = &w->cur;
    co.rank = w->rank;
    co.count = w->n;
    co.connect_timeout_s = w->connect_timeout;
    co.round_deadline_floor_s = w->round_deadline;
    co.global_timeout_s = w->collective_timeout;
    co.log = w->log;
    co.log_user = w->log_user;
    co.secret = slen ? secret : NULL;
    co.secret_len = slen;
    co.encrypt = w->encrypt;
    co.cancelled = superseded;
    co.cancel_user = w;
    co.use_listen_fd = w->listen_fd >= 0;
    co.listen_fd = w->listen_fd;
    /* the agent's --transport: nccl moves large payloads over NCCL on the process's device 0
     * (CUDA_VISIBLE_DEVICES, set by the agent, names the GPU) */
    co.transport =
        strcmp(w->cfg.transport, "nccl") == 0 ? WAGMA_TRANSPORT_NCCL : WAGMA_TRANSPORT_TCP;
    co.device = 0;
    wagma_comm_t *c = NULL;
    e = wagma_comm_create(&co, &c);
    memset(secret, 0, sizeof secret);
    if (e == WAGMA_ECANCELED)
      continue; /* a newer plan or a stop: the loop takes it */
    if (e) {
      if (create_since == 0)
        create_since = wg_mono();
      if (wg_mono() - create_since > w->create_retry) {
        wg_worker_fail(w, e, "cannot create the communicator of epoch %llu: %s",
                       (unsigned long long)w->epoch, wagma_strerror(e));
        report(w, WAGMA_PROGRESS_UNAVAILABLE, w->err);
        w->epoch = w->cur.epoch; /* wait for a newer plan */
        create_since = 0;
        continue;
      }
      WLOG(w, WAGMA_LOG_WARN, "epoch %llu: cannot create the communicator (%s); retrying",
           (unsigned long long)w->epoch, wagma_strerror(e));
      struct timespec ts = {0, 500000000L};
      nanosleep(&ts, NULL);
      w->epoch = 0; /* retry the same plan */
      continue;
    }
    pthread_mutex_lock(&w->mu);
    w->comm = c;
    pthread_mutex_unlock(&w->mu);
    int all_joiners = 1;
    for (int i = 0; i < w->cur.nranks; i++)
      all_joiners &= w->cur.members[i].joiner;
    int plan_joiner = w->cur.members[w->rank].joiner && !all_joiners;
    int restored = restore_checkpoint(w, plan_joiner);
    const char *how = "";
    float weight = 0;
    double sync_t0 = wg_mono();
    e = opening_sync(w, plan_joiner, &how, &weight);
    if (e == WAGMA_ECANCELED)
      continue;
    if (e) {
      /* a joiner that got no model must not train from its seed: out until a newer plan */
      WLOG(w, WAGMA_LOG_ERROR, "job %s: %s; reporting this member unavailable for the job",
           w->cfg.job, w->err);
      wg_worker_close_comm(w);
      report(w, WAGMA_PROGRESS_UNAVAILABLE, w->err);
      continue;
    }
    w->iteration = w->cur.start_round;
    w->alone = 0;
    if (w->fresh && !restored && w->iteration > 0 && w->total && w->iteration >= w->total) {
      /* nothing left to train: the "result" would be the seed's model */
      wg_worker_fail(w, WAGMA_ENOTFOUND,
                     "epoch %llu starts at the job's last iteration %llu with no trained model (no "
                     "survivor, no checkpoint): the job's model is lost",
                     (unsigned long long)w->epoch, (unsigned long long)w->iteration);
      report(w, WAGMA_PROGRESS_FAILED, w->err);
      w->done = 1;
      return WAGMA_ENOTFOUND;
    }
    char got[96] = "";
    if (w->joined)
      snprintf(got, sizeof got, "; joined: model and %zu floats of optimizer state received",
               w->st.size ? w->st.size(w->st_user) : 0);
    WLOG(w, WAGMA_LOG_INFO,
         "job %s: epoch %llu joined as rank %d/%d (%s, weight %.0f), iteration %llu of %llu, "
         "sync %.3f s, data plane %s%s",
         w->cfg.job, (unsigned long long)w->epoch, w->rank, w->cur.nranks, how, weight,
         (unsigned long long)w->iteration, (unsigned long long)w->total, wg_mono() - sync_t0,
         w->encrypt ? "authenticated and encrypted" : "authenticated", got);
    report(w, WAGMA_PROGRESS_RUNNING, NULL);
    return 0;
  }
}

/* At an iteration boundary: a newer plan (or none yet) -> the next epoch. */
int wg_worker_boundary(wagma_worker_t *w) {
  pthread_mutex_lock(&w->mu);
  int stop = w->stop, newer = w->have_plan && w->plan.epoch > w->epoch;
  pthread_mutex_unlock(&w->mu);
  if (stop)
    return wg_worker_fail(w, WAGMA_ECANCELED, "stopped: %s", w->stop_reason);
  if (newer || !w->comm)
    return enter_epoch(w);
  return 0;
}

/* ---- the API ------------------------------------------------------------------------------- */

int wagma_worker_open(const char *socket_path, wagma_log_fn log, void *log_user,
                      wagma_worker_t **out) {
  *out = NULL;
  const char *path = socket_path ? socket_path : getenv(WG_PROTO_ENV_SOCKET);
  if (!path || !path[0])
    return WAGMA_EINVAL;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return WAGMA_EINVAL;
  memcpy(sa.sun_path, path, strlen(path));
  wagma_worker_t *w = calloc(1, sizeof *w);
  if (!w)
    return WAGMA_ENOMEM;
  w->log = log;
  w->log_user = log_user;
  w->fd = -1;
  w->wake[0] = w->wake[1] = -1;
  w->rank = -1;
  w->loss = w->accuracy = w->step_ema = NAN;
  const char *lfd = getenv(WG_PROTO_ENV_LISTEN_FD);
  w->listen_fd = lfd && lfd[0] ? atoi(lfd) : -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  int e = 0;
  w->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (w->fd < 0 || connect(w->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    e = WAGMA_EUNAVAIL;
    goto fail;
  }
  if (pipe2(w->wake, O_CLOEXEC) != 0) {
    e = WAGMA_EIO;
    goto fail;
  }
  e = send_msg(w, json_pack("{s:s,s:i,s:I}", "type", "hello", "version", WG_PROTO_VERSION, "pid",
                            (json_int_t)getpid()));
  if (e)
    goto fail;
  if (pthread_create(&w->thread, NULL, control_main, w) != 0) {
    e = WAGMA_ENOMEM;
    goto fail;
  }
  w->thread_started = 1;
  pthread_mutex_lock(&w->mu);
  int got = wait_until(w, config_or_stop, wg_mono() + CONFIG_WAIT_S);
  int have = w->have_config;
  pthread_mutex_unlock(&w->mu);
  if (!got || !have) {
    e = got ? WAGMA_EPROTO : WAGMA_ETIMEDOUT;
    goto fail;
  }
  w->total = w->cfg.iterations;
  *out = w;
  return 0;
fail:
  wagma_worker_close(w);
  return e;
}

int wagma_worker_config(const wagma_worker_t *w, wagma_worker_config_t *out) {
  *out = w->cfg;
  return 0;
}

int wagma_worker_register(wagma_worker_t *w, float *params, size_t n,
                          const wagma_worker_state_fns_t *state, void *state_user) {
  if (w->params)
    return wg_worker_fail(w, WAGMA_EEXIST, "the parameters are registered already");
  if (!params || n == 0)
    return wg_worker_fail(w, WAGMA_EINVAL, "no parameters to register");
  if (state && (!state->size || (state->size(state_user) > 0 && (!state->save || !state->load))))
    return wg_worker_fail(w, WAGMA_EINVAL, "state functions need size, save and load");
  w->params = params;
  w->n = n;
  if (w->device) {
    void *host = NULL, *grads = NULL;
    int ce = w->cuda.malloc_host(&host, n * sizeof(float));
    if (ce == 0)
      ce = w->cuda.malloc_host(&grads, n * sizeof(float));
    if (ce) {
      if (host)
        w->cuda.free_host(host);
      w->params = NULL;
      return wg_worker_fail(w, WAGMA_ENOMEM,
                            "no page-locked memory for %zu floats: CUDA error %d (%s)", n, ce,
                            w->cuda.error_string(ce));
    }
    w->dparams = params;
    w->params = host;
    w->hgrads = grads;
  }
  if (state)
    w->st = *state;
  w->st_user = state_user;
  return enter_epoch(w);
}

int wagma_worker_set_iterations(wagma_worker_t *w, uint64_t iterations) {
  if (w->cfg.iterations == 0)
    w->total = iterations;
  return 0;
}

int wagma_worker_should_stop(wagma_worker_t *w) {
  pthread_mutex_lock(&w->mu);
  int stop = w->stop;
  pthread_mutex_unlock(&w->mu);
  return stop || w->done || (w->total && w->iteration >= w->total);
}

int wagma_worker_average_gradients(wagma_worker_t *w, float *grads) {
  char why[256];
  if (strcmp(w->cfg.algorithm, "allreduce") != 0)
    return 0;
  float *host = w->device ? w->hgrads : grads;
  for (int attempt = 0; attempt < 2; attempt++) {
    int e = wg_worker_boundary(w);
    if (e)
      return e;
    if (w->device && (e = wg_cuda_to_host(&w->cuda, host, grads, w->n, w->stream, why, sizeof why)))
      return wg_worker_fail(w, e, "the device gradients: %s", why);
    e = wagma_comm_allreduce(w->comm, host, w->n, WAGMA_REDUCE_MEAN);
    if (e == WAGMA_ECANCELED) {
      wg_worker_close_comm(w); /* a newer plan: again there */
      continue;
    }
    if (e) /* a lost peer: local this once (the gradients as they were) */
      return wg_worker_warn(w, "gradient allreduce", e), 0;
    if (w->device &&
        (e = wg_cuda_to_device(&w->cuda, grads, host, w->n, w->stream, why, sizeof why)))
      return wg_worker_fail(w, e, "the device gradients: %s", why);
    return 0;
  }
  return 0;
}

int wg_worker_averages(const wagma_worker_t *w) {
  return strcmp(w->cfg.algorithm, "wagma") == 0 || strcmp(w->cfg.algorithm, "allreduce") == 0 ||
         strcmp(w->cfg.algorithm, "local-sgd") == 0;
}

int wg_worker_step_end(wagma_worker_t *w, uint64_t before) {
  double now = wg_mono();
  if (w->last_step_at > 0) {
    double dt = now - w->last_step_at;
    w->step_ema = isfinite(w->step_ema) ? 0.9 * w->step_ema + 0.1 * dt : dt;
  }
  w->last_step_at = now;
  w->ck_due = w->rank == 0 && w->ck_every && w->ck_dir &&
              (before / w->ck_every != w->iteration / w->ck_every ||
               (w->total && w->iteration >= w->total));
  if (now - w->last_report >= w->progress_interval)
    report(w, WAGMA_PROGRESS_RUNNING, NULL);
  pthread_mutex_lock(&w->mu);
  int stop = w->stop;
  pthread_mutex_unlock(&w->mu);
  return stop ? wg_worker_fail(w, WAGMA_ECANCELED, "stopped: %s", w->stop_reason) : 0;
}

int wagma_worker_step(wagma_worker_t *w) {
  if (!wg_worker_averages(w))
    return wagma_worker_advance(w, 1); /* the program averages by its own algorithm */
  int e = wg_worker_boundary(w);
  if (e)
    return e;
  w->has_model = 1;
  uint64_t before = w->iteration;
  if (strcmp(w->cfg.algorithm, "wagma") == 0) {
    wagma_round_stats_t st;
    memset(&st, 0, sizeof st);
    if ((e = wg_worker_params_in(w)))
      return e;
    e = wagma_comm_step(w->comm, w->params, &st);
    int out = wg_worker_params_out(w); /* what the engine wrote, whatever it said */
    if (out)
      return out;
    w->alone = st.alone_rounds;
    if (e == 0) {
      w->staleness = st.max_staleness;
      w->round_global = st.kind == WAGMA_ROUND_GLOBAL;
      w->ngroup = 0;
      const int *ranks = NULL;
      int g = w->round_global ? 0 : wagma_plan_group(&w->cur, st.round, w->rank, NULL, &ranks);
      if (g > 0 && g <= 64) {
        memcpy(w->group, ranks, (size_t)g * sizeof *ranks);
        w->ngroup = g;
      }
    }
    w->iteration = wagma_comm_round(w->comm);
  } else {
    w->iteration++;
    if (strcmp(w->cfg.algorithm, "local-sgd") == 0 && w->cfg.staleness_bound > 0 &&
        w->iteration % (uint64_t)w->cfg.staleness_bound == 0) {
      if ((e = wg_worker_params_in(w)))
        return e;
      e = wagma_comm_allreduce(w->comm, w->params, w->n, WAGMA_REDUCE_MEAN);
      int out = e ? 0 : wg_worker_params_out(w);
      if (out)
        return out;
    }
  }
  if (e == WAGMA_ECANCELED)
    wg_worker_close_comm(w); /* a newer plan or a stop: the next boundary takes it */
  else if (e)
    wg_worker_warn(w, "model averaging", e);
  return wg_worker_step_end(w, before);
}

int wagma_worker_report(wagma_worker_t *w, double loss, double accuracy) {
  if (isfinite(loss))
    w->loss = loss;
  if (isfinite(accuracy))
    w->accuracy = accuracy;
  return 0;
}

int wagma_worker_status(const wagma_worker_t *w, wagma_worker_status_t *out) {
  memset(out, 0, sizeof *out);
  out->epoch = w->epoch;
  out->rank = w->comm ? w->rank : -1;
  out->size = w->comm ? w->cur.nranks : 0;
  out->iteration = w->iteration;
  out->joined = w->joined;
  out->round_global = w->round_global;
  out->ngroup = w->ngroup;
  memcpy(out->group, w->group, sizeof out->group);
  out->staleness = w->staleness;
  return 0;
}

int wagma_worker_final_average(wagma_worker_t *w) {
  int in = wg_worker_params_in(w);
  if (in)
    return in;
  if (!w->nfp) /* the models as trained: how far apart they ended shows the averaging worked */
    wg_fingerprint(w->params, w->n, w->fp, &w->nfp);
  for (int attempt = 0; attempt < 3; attempt++) {
    int e = wg_worker_boundary(w);
    if (e)
      return e;
    e = wagma_comm_average(w->comm, w->params, w->n, 1.0f);
    if (e == 0) {
      w->finished = 1;
      return wg_worker_params_out(w);
    }
    if (e != WAGMA_ECANCELED)
      return wg_worker_fail(w, e, "the final average failed: %s (%s)", wagma_strerror(e),
                            wagma_comm_last_error(w->comm));
    wg_worker_close_comm(w);
  }
  return wg_worker_fail(w, WAGMA_ECANCELED, "the final average was superseded three times");
}

int wagma_worker_done(wagma_worker_t *w, double loss, double accuracy) {
  wagma_worker_report(w, loss, accuracy);
  if (!w->finished && wg_worker_params_in(w))
    return WAGMA_EIO;
  for (size_t i = 0; i < w->n; i++)
    if (!isfinite(w->params[i]))
      return wagma_worker_fail(w, "the final model is not finite (NaN or Inf)");
  w->done = 1;
  int e = report(w, WAGMA_PROGRESS_DONE, NULL);
  return e ? wg_worker_fail(w, e, "cannot report to the agent: %s", wagma_strerror(e)) : 0;
}

int wagma_worker_fail(wagma_worker_t *w, const char *why) {
  w->done = 1;
  snprintf(w->err, sizeof w->err, "%s", why ? why : "failed");
  int e = report(w, WAGMA_PROGRESS_FAILED, why ? why : "the program failed");
  return e ? e : 0;
}

int wagma_worker_use_cuda(wagma_worker_t *w, void *stream) {
  char why[300];
  if (w->params)
    return wg_worker_fail(w, WAGMA_EEXIST,
                          "wagma_worker_use_cuda comes before wagma_worker_register");
  if (!w->device) {
    int e = wg_cuda_load(&w->cuda, why, sizeof why);
    if (e)
      return wg_worker_fail(w, e, "device buffers: %s", why);
  }
  w->device = 1;
  w->stream = stream;
  return 0;
}

const char *wagma_worker_spec(const wagma_worker_t *w) {
  return w->spec ? w->spec : "{}";
}

int wagma_worker_unavailable(wagma_worker_t *w, const char *why) {
  w->done = 1;
  snprintf(w->err, sizeof w->err, "%s", why ? why : "unavailable");
  return report(w, WAGMA_PROGRESS_UNAVAILABLE, why ? why : "this member cannot serve the job");
}

int wagma_worker_set_restore(wagma_worker_t *w, wagma_worker_restore_fn restore, void *user) {
  w->restore = restore;
  w->restore_user = user;
  return 0;
}

int wagma_worker_checkpoint_due(const wagma_worker_t *w) {
  return w->ck_due;
}

int wagma_worker_checkpoint_saved(wagma_worker_t *w, const char *path, uint64_t iteration) {
  if (!path || !path[0] || path[0] == '/' || strlen(path) >= WAGMA_API_CHECKPOINT_PATH_MAX)
    return wg_worker_fail(w, WAGMA_EINVAL,
                          "a checkpoint path relative to the checkpoint root, please");
  w->ck_due = 0;
  int e = send_msg(w, json_pack("{s:s,s:s,s:I,s:I}", "type", "checkpoint", "path", path,
                                "iteration", (json_int_t)iteration, "epoch", (json_int_t)w->epoch));
  return e ? wg_worker_fail(w, e, "cannot tell the agent: %s", wagma_strerror(e)) : 0;
}

static int stopped(wagma_worker_t *w) {
  return w->stop;
}

void wagma_worker_close(wagma_worker_t *w) {
  if (!w)
    return;
  if (w->done && w->comm && w->thread_started) {
    /* peers may still be in the final average through this member: stay until stop */
    pthread_mutex_lock(&w->mu);
    wait_until(w, stopped, wg_mono() + w->linger);
    pthread_mutex_unlock(&w->mu);
  }
  wg_worker_close_comm(w);
  if (w->thread_started) {
    if (w->wake[1] >= 0 && write(w->wake[1], "x", 1) < 0)
      shutdown(w->fd, SHUT_RDWR);
    pthread_join(w->thread, NULL);
  }
  if (w->fd >= 0)
    close(w->fd);
  for (int i = 0; i < 2; i++)
    if (w->wake[i] >= 0)
      close(w->wake[i]);
  wagma_plan_free(&w->plan);
  wagma_plan_free(&w->cur);
  memset(w->secret, 0, sizeof w->secret);
  free(w->sync_buf);
  free(w->spec);
  if (w->device) {
    if (w->params) { /* the last copy to the device reads the mirror: let it end first */
      w->cuda.stream_synchronize(w->stream);
      w->cuda.free_host(w->params);
      w->cuda.free_host(w->hgrads);
    }
    wg_cuda_unload(&w->cuda);
  }
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}
