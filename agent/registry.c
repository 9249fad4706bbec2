/* agent/registry.c — the control thread of wagma-agent: everything the agent says to etcd.
 *
 * Owns the etcd handle, the lease and its keepalive, the watch on <prefix>/assignments/<me>
 * and the watch on the plan of the job assigned to me. It:
 *  - at startup (the control thread's first task; the main thread polls wg_control_state):
 *    waits for etcd up to --etcd-startup-timeout (wagma_etcd_wait_ready), then registers:
 *    creates <prefix>/agents/<me> (address, device, capacity, version, started) under a lease
 *    kept alive by the etcd library, only if the key is absent (one Txn). A name held by
 *    another lease is watched for one keepalive period: a refreshed lease is a live agent of
 *    that name (refused: WAGMA_EEXIST), an unrefreshed one a crashed previous run (revoked,
 *    the name taken);
 *  - when the lease is lost (etcd was away longer than the TTL) registers again the same way
 *    (create only if absent; never over another process's key), retrying every second;
 *  - follows the assignment: on a new job it reads the spec, the plan and the checkpoint
 *    record and starts watching the plan; every valid plan of a newer epoch is handed to the
 *    runner through wg_shared_t (with the checkpoint record read again and, when the plan
 *    lists me, the epoch's data-plane secret <prefix>/secrets/<job>/<epoch>); the program's
 *    libwagma aborts its communicator of an older epoch when the plan reaches it, so a round
 *    blocked on a frozen peer gives way at once;
 *  - publishes the runner's progress (at most one put per progress_interval_s, at once for
 *    a final state) and rank 0's checkpoint records;
 *  - while it has no job, follows its quarantine for being cut off from its peers: probes
 *    their addresses (probe.c) and says in its registration when it reaches them all
 *    (follow_quarantine; docs/design.md §7.3).
 * etcd being down never blocks training: only this thread waits on etcd (every call has the
 * handle's deadline), and the job's program keeps training on the last plan meanwhile.
 *
 * Threads: the control thread; the etcd library's watch / keepalive threads run the callbacks
 * below, which only copy values under c->mu and wake the control thread. The startup outcome
 * (c->startup, c->startup_error) is read by the main thread under c->mu. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "agent/agent.h"
#include "agent/probe.h"
#include "wagma/api.h"
#include "wagma/etcd.h"
#include "wagma/log_internal.h"

/* What a watch callback learnt about one key, under wg_control.mu. */
typedef struct watched {
  int changed; /* news since the control thread last looked */
  int present; /* the key exists (value holds it) */
  int dead;    /* the watch ended with an error: start it again */
  char *value; /* the latest value, NULL when deleted */
} watched_t;

struct wg_control {
  const wg_agent_options_t *opt;
  wg_shared_t *shared;
  wagma_keys_t keys;
  wagma_etcd_t *etcd;
  pthread_t thread;
  int thread_started;
  double started; /* unix seconds, in the registration */

  pthread_mutex_t mu; /* guards the fields written by callbacks, stop and the startup outcome */
  pthread_cond_t cv;
  int stop;
  int startup; /* 1 while starting, 0 once registered, a negative error when startup failed */
  char startup_error[512];
  watched_t assign, plan; /* the news of <prefix>/assignments/<me> and of the job's plan */
  atomic_int lease_lost;

  /* control thread only */
  int64_t lease;
  int64_t lost_lease; /* the lease last given up as lost, until registered again */
  wagma_etcd_keepalive_t *keepalive;
  double next_register;
  int register_failures;
  wagma_etcd_watch_t *assign_watch;
  double next_assign_watch;
  wagma_etcd_watch_t *plan_watch;
  char job[WAGMA_NAME_MAX]; /* the job assigned, "" = none */
  int job_loaded;           /* spec read and handed to the runner */
  double next_job_load;
  uint64_t plan_epoch; /* epoch of the last plan handed over */
  double last_progress;
  double next_quarantine_check; /* follow_quarantine */
  double reached;               /* the `since` of the quarantine this agent said it left */
};

#define LOG(c, lvl, ...) wg_logf(wg_agent_log, (void *)(c)->opt->name, lvl, __VA_ARGS__)

/* ---- callbacks (library threads) ---------------------------------------------------------- */

static void on_lease_lost(void *user, int64_t lease, int status) {
  wg_control_t *c = user;
  (void)lease;
  LOG(c, WAGMA_LOG_WARN, "lease lost (%s): registering again", wagma_strerror(status));
  atomic_store(&c->lease_lost, 1);
  pthread_mutex_lock(&c->mu);
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* Records a watch callback's news about one key: the newest event, or with puts_only the
 * newest PUT (a DELETE is then no news); status != 0 marks the watch dead. */
static void note_watch(wg_control_t *c, watched_t *w, int status, const wagma_etcd_event_t *ev,
                       size_t n, int puts_only) {
  pthread_mutex_lock(&c->mu);
  if (status != 0) {
    w->dead = 1;
  } else {
    for (size_t i = n; i-- > 0;) {
      if (puts_only && ev[i].type != WAGMA_ETCD_EVENT_PUT)
        continue;
      free(w->value);
      w->present = ev[i].type == WAGMA_ETCD_EVENT_PUT;
      w->value = w->present ? strndup(ev[i].kv.value, ev[i].kv.value_len) : NULL;
      w->changed = 1;
      break;
    }
  }
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static void on_assignment(void *user, int status, const wagma_etcd_event_t *ev, size_t n,
                          int64_t revision) {
  (void)revision;
  wg_control_t *c = user;
  note_watch(c, &c->assign, status, ev, n, 0);
}

/* Only a PUT of the plan is news. */
static void on_plan(void *user, int status, const wagma_etcd_event_t *ev, size_t n,
                    int64_t revision) {
  (void)revision;
  wg_control_t *c = user;
  note_watch(c, &c->plan, status, ev, n, 1);
}

/* ---- registration ------------------------------------------------------------------------ */

/* Who holds the agent key when a registration found it taken. */
typedef struct holder {
  int64_t lease, mod;
  char address[WAGMA_API_ADDR_MAX];
  double started;
} holder_t;

/* One registration attempt: a new lease, and the agent key put under it only if the key does
 * not exist (one Txn: CREATE(key) == 0), so two processes never share the name. Returns 0
 * (c->lease set, its keepalive running), WAGMA_ECONFLICT with the key's holder in *h, or an
 * etcd error. */
static int try_register(wg_control_t *c, holder_t *h) {
  char key[256];
  char *info = NULL;
  int64_t lease = 0;
  wagma_etcd_txn_result_t tr;
  int e;
  memset(&tr, 0, sizeof tr);
  memset(h, 0, sizeof *h);
  wagma_key_agent(&c->keys, c->opt->name, key, sizeof key);
  if (!(info = wg_agent_info_json(c->opt, c->started, 0)))
    return WAGMA_ENOMEM;
  if ((e = wagma_etcd_lease_grant(c->etcd, c->opt->lease_ttl_s, &lease)))
    goto out;
  wagma_etcd_cmp_t absent = {
      .key = key, .target = WAGMA_ETCD_CMP_CREATE, .result = WAGMA_ETCD_EQUAL, .number = 0};
  wagma_etcd_op_t put = {.type = WAGMA_ETCD_OP_PUT,
                         .key = key,
                         .value = info,
                         .value_len = strlen(info),
                         .lease = lease};
  wagma_etcd_op_t get = {.type = WAGMA_ETCD_OP_RANGE, .key = key};
  e = wagma_etcd_txn(c->etcd, &absent, 1, &put, 1, &get, 1, &tr);
  if (e == WAGMA_ECONFLICT) {
    if (tr.n == 1 && tr.results[0].range.n == 1) {
      const wagma_etcd_kv_t *kv = &tr.results[0].range.kvs[0];
      wagma_agent_info_t ai;
      wagma_api_error_t aerr;
      h->lease = kv->lease;
      h->mod = kv->mod_revision;
      if (wagma_agent_info_from_json(kv->value, kv->value_len, &ai, &aerr) == 0) {
        snprintf(h->address, sizeof h->address, "%s", ai.address);
        h->started = ai.started;
      }
    }
    goto out; /* (deleted meanwhile: h->lease 0, h->mod 0; the caller tries again) */
  }
  if (e)
    goto out;
  if ((e = wagma_etcd_keepalive_start(c->etcd, lease, on_lease_lost, c, &c->keepalive)))
    goto out;
  c->lease = lease;
  lease = 0;
  LOG(c, WAGMA_LOG_INFO, "registered %s (address %s, lease %llx, ttl %d s)", key, c->opt->advertise,
      (unsigned long long)c->lease, c->opt->lease_ttl_s);
out:
  if (lease)
    wagma_etcd_lease_revoke(c->etcd, lease);
  wagma_etcd_txn_result_free(&tr);
  free(info);
  return e;
}

/* wg_control_stop was called. */
static int stopping(wg_control_t *c) {
  pthread_mutex_lock(&c->mu);
  int stop = c->stop;
  pthread_mutex_unlock(&c->mu);
  return stop;
}

/* Whether a lease is kept alive by some process: its TTL is watched for one keepalive period
 * (wagma_etcd_keepalive refreshes every third of the granted TTL) plus 2 s for etcd's whole
 * seconds and a slow refresh; a refresh shows as a TTL that grows. 1 = alive, 0 = expired or
 * not refreshed, or a negative error. */
static int lease_alive(wg_control_t *c, int64_t lease) {
  int64_t remaining = 0, granted = 0, lowest = INT64_MAX;
  double until = 0;
  for (;;) {
    int e = wagma_etcd_lease_ttl(c->etcd, lease, &remaining, &granted);
    if (e == WAGMA_ENOTFOUND || (e == 0 && remaining <= 0))
      return 0;
    if (e)
      return e;
    if (until == 0)
      until = wg_mono() + (double)granted / 3.0 + 2.0;
    if (remaining > lowest)
      return 1;
    lowest = remaining < lowest ? remaining : lowest;
    if (wg_mono() >= until)
      return 0;
    if (stopping(c))
      return WAGMA_ECANCELED;
    wg_sleep_s(0.2);
  }
}

/* The first registration (startup). A name held by a live agent is refused. */
static int register_at_start(wg_control_t *c, char *err, size_t err_len) {
  char key[256];
  wagma_key_agent(&c->keys, c->opt->name, key, sizeof key);
  for (int attempt = 0; attempt < 5; attempt++) {
    holder_t h;
    int e = try_register(c, &h);
    if (e == 0)
      return 0;
    if (e != WAGMA_ECONFLICT) {
      snprintf(err, err_len, "cannot register %s: %s (%s)", key, wagma_strerror(e),
               wagma_etcd_errmsg(c->etcd));
      return e;
    }
    if (h.mod == 0)
      continue; /* deleted between the compare and the read: try again */
    if (h.lease == 0) {
      /* A key without a lease never expires: not an agent's registration (a leftover put by
       * hand). Take it over. */
      wagma_etcd_cmp_t same = {
          .key = key, .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = h.mod};
      wagma_etcd_op_t del = {.type = WAGMA_ETCD_OP_DELETE, .key = key};
      LOG(c, WAGMA_LOG_WARN, "%s exists without a lease; replacing it", key);
      wagma_etcd_txn(c->etcd, &same, 1, &del, 1, NULL, 0, NULL);
      continue;
    }
    LOG(c, WAGMA_LOG_INFO,
        "%s is held by lease %llx (address %s): checking whether that agent is alive", key,
        (unsigned long long)h.lease, h.address[0] ? h.address : "?");
    int alive = lease_alive(c, h.lease);
    if (alive == WAGMA_ECANCELED) {
      snprintf(err, err_len, "stopped while checking the holder of %s", key);
      return alive;
    }
    if (alive < 0) {
      snprintf(err, err_len, "cannot check the holder of %s: %s (%s)", key, wagma_strerror(alive),
               wagma_etcd_errmsg(c->etcd));
      return alive;
    }
    if (alive) {
      snprintf(err, err_len,
               "the name %s is in use by a live agent (address %s, started %.0f, lease %llx "
               "kept alive): not starting a second one",
               c->opt->name, h.address[0] ? h.address : "?", h.started,
               (unsigned long long)h.lease);
      return WAGMA_EEXIST;
    }
    /* A previous run of this name that died before its lease expired: revoke it, so that the
     * coordinator sees the departure and this process joins as a joiner (docs/api.md). */
    LOG(c, WAGMA_LOG_INFO, "revoking the lease %llx of a previous run of %s (not kept alive)",
        (unsigned long long)h.lease, c->opt->name);
    wagma_etcd_lease_revoke(c->etcd, h.lease);
  }
  snprintf(err, err_len, "cannot register %s: it keeps changing hands", key);
  return WAGMA_ECONFLICT;
}

/* Registers again after the lease was lost, the same way (create only if absent), retrying
 * every second; the key of another process (a live one, or one whose lease has not expired
 * yet) is left alone. The key still held by the lease given up as lost is this process's own
 * registration, alive after all (etcd restarted and renewed every lease's TTL, or only our
 * refreshes failed): it is kept, with a new keepalive, so the coordinator sees no departure. */
static void ensure_registered(wg_control_t *c) {
  holder_t h;
  int e;
  if (c->keepalive && !atomic_load(&c->lease_lost))
    return;
  if (wg_mono() < c->next_register)
    return;
  if (c->keepalive) {
    wagma_etcd_keepalive_stop(c->keepalive);
    c->keepalive = NULL;
    c->lost_lease = c->lease;
    c->lease = 0;
  }
  atomic_store(&c->lease_lost, 0);
  e = try_register(c, &h);
  int own = e == WAGMA_ECONFLICT && c->lost_lease && h.lease == c->lost_lease; /* our own key */
  if (own && wagma_etcd_keepalive_start(c->etcd, h.lease, on_lease_lost, c, &c->keepalive) == 0) {
    c->lease = h.lease;
    LOG(c, WAGMA_LOG_INFO,
        "lease %llx still holds this agent's registration: keeping it (refreshed again)",
        (unsigned long long)c->lease);
    e = 0;
  }
  if (e == 0) {
    c->lost_lease = 0;
    c->register_failures = 0;
    return;
  }
  if (own) {
    /* our own key, whose lease could not be refreshed: it expired as we tried (the key goes
     * with it), or etcd did not answer (the next try keeps it) */
    LOG(c, WAGMA_LOG_INFO,
        "lease %llx of this agent's registration could not be refreshed (%s); trying again",
        (unsigned long long)h.lease, wagma_etcd_errmsg(c->etcd));
    c->next_register = wg_mono() + 0.2;
    return;
  }
  if (c->register_failures++ % 30 == 0) {
    if (e == WAGMA_ECONFLICT)
      LOG(c, WAGMA_LOG_ERROR,
          "cannot register again: the name %s is held by another process (lease %llx, address "
          "%s); retrying",
          c->opt->name, (unsigned long long)h.lease, h.address[0] ? h.address : "?");
    else
      LOG(c, WAGMA_LOG_WARN, "cannot register with etcd (%s: %s); retrying", wagma_strerror(e),
          wagma_etcd_errmsg(c->etcd));
  }
  c->next_register = wg_mono() + 1.0;
}

/* Asked by the start-up wait (wagma_etcd_wait_ready) between its tries. */
static int stop_asked(void *c) {
  return stopping(c);
}

/* ---- assignment and plan ----------------------------------------------------------------- */

static void ensure_assignment_watch(wg_control_t *c) {
  char key[256];
  wagma_etcd_range_t r;
  int dead;
  pthread_mutex_lock(&c->mu);
  dead = c->assign.dead;
  pthread_mutex_unlock(&c->mu);
  if (c->assign_watch && !dead)
    return;
  if (wg_mono() < c->next_assign_watch)
    return;
  wagma_etcd_watch_stop(c->assign_watch);
  c->assign_watch = NULL;
  wagma_key_assignment(&c->keys, c->opt->name, key, sizeof key);
  memset(&r, 0, sizeof r);
  if (wagma_etcd_range(c->etcd, key, NULL, &r) != 0) {
    c->next_assign_watch = wg_mono() + 1.0;
    return;
  }
  wagma_etcd_watch_options_t wo = {.start_revision = r.revision + 1};
  pthread_mutex_lock(&c->mu);
  free(c->assign.value);
  c->assign.value = r.n ? strndup(r.kvs[0].value, r.kvs[0].value_len) : NULL;
  c->assign.present = r.n > 0;
  c->assign.changed = 1;
  c->assign.dead = 0;
  pthread_mutex_unlock(&c->mu);
  wagma_etcd_range_free(&r);
  if (wagma_etcd_watch_start(c->etcd, key, &wo, on_assignment, c, &c->assign_watch) != 0) {
    c->assign_watch = NULL;
    c->next_assign_watch = wg_mono() + 1.0;
  }
}

/* A newer plan of the job arrived while we were reading: waiting for an older one's secret is
 * pointless. */
static int newer_plan_waiting(wg_control_t *c) {
  pthread_mutex_lock(&c->mu);
  int changed = c->plan.changed || c->assign.changed || c->stop;
  pthread_mutex_unlock(&c->mu);
  return changed;
}

/* Reads the data-plane secret of the job's plan epoch into secret (WAGMA_API_SECRET_LEN bytes).
 * The coordinator writes it in the plan's Txn, so it is there whenever the plan is; a failed
 * read is retried for up to SECRET_READ_S (given up at once when a newer plan or a stop
 * comes). Returns its length, or 0 when there is none: the program then refuses the epoch
 * (libwagma reports this agent unavailable) rather than run its data plane unauthenticated. Every
 * copy of the hex value this code sees is wiped. */
#define SECRET_READ_S 5.0

static size_t read_secret(wg_control_t *c, uint64_t epoch, uint8_t *secret) {
  char key[256];
  int e;
  double deadline = wg_mono() + SECRET_READ_S;
  if (wagma_key_secret(&c->keys, c->job, epoch, key, sizeof key) != 0)
    return 0;
  for (;;) {
    wagma_etcd_kv_t *kv = NULL;
    e = wagma_etcd_get(c->etcd, key, &kv, NULL);
    if (e == 0) {
      int bad = wagma_secret_from_hex(kv->value, kv->value_len, secret, WAGMA_API_SECRET_LEN);
      OPENSSL_cleanse(kv->value, kv->value_len);
      wagma_etcd_kv_free(kv);
      if (!bad)
        return WAGMA_API_SECRET_LEN;
      OPENSSL_cleanse(secret, WAGMA_API_SECRET_LEN);
      LOG(c, WAGMA_LOG_ERROR, "job %s: %s is not %d hex characters: ignoring it", c->job, key,
          2 * WAGMA_API_SECRET_LEN);
      break;
    }
    if (wg_mono() >= deadline || newer_plan_waiting(c))
      break;
    wg_sleep_s(0.1);
  }
  if (e)
    LOG(c, WAGMA_LOG_WARN,
        "job %s: no data-plane secret for epoch %llu (%s: %s): this agent will not run that "
        "epoch",
        c->job, (unsigned long long)epoch, key,
        e == WAGMA_ENOTFOUND ? "not found" : wagma_etcd_errmsg(c->etcd));
  return 0;
}

/* Hands the plan (JSON) to the runner if it is valid and not older than the last one, with its
 * epoch's data-plane secret. */
static void offer_plan(wg_control_t *c, const char *json, size_t len) {
  wagma_plan_t plan;
  char err[256], key[256];
  wagma_etcd_kv_t *kv = NULL;
  wg_checkpoint_rec_t ck;
  int have_ck = 0;
  memset(&plan, 0, sizeof plan);
  if (wagma_plan_from_json(json, len, &plan, err, sizeof err) != 0) {
    LOG(c, WAGMA_LOG_WARN, "job %s: ignoring an invalid plan: %s", c->job, err);
    return;
  }
  if (c->plan_epoch && plan.epoch < c->plan_epoch) {
    wagma_plan_free(&plan);
    return;
  }
  wagma_key_job_checkpoint(&c->keys, c->job, key, sizeof key);
  if (wagma_etcd_get(c->etcd, key, &kv, NULL) == 0) {
    have_ck = wg_checkpoint_rec_from_json(kv->value, kv->value_len, &ck) == 0;
    wagma_etcd_kv_free(kv);
  }
  uint8_t secret[WAGMA_API_SECRET_LEN];
  size_t secret_len =
      wagma_plan_rank_of(&plan, c->opt->name) >= 0 ? read_secret(c, plan.epoch, secret) : 0;
  c->plan_epoch = plan.epoch;
  LOG(c, WAGMA_LOG_INFO, "job %s: plan epoch %llu, %d members, start round %llu%s", c->job,
      (unsigned long long)plan.epoch, plan.nranks, (unsigned long long)plan.start_round,
      wagma_plan_rank_of(&plan, c->opt->name) >= 0 ? "" : " (not a member)");
  pthread_mutex_lock(&c->shared->mu);
  wagma_plan_free(&c->shared->plan);
  c->shared->plan = plan; /* moved */
  c->shared->have_plan = 1;
  OPENSSL_cleanse(c->shared->secret, sizeof c->shared->secret);
  if (secret_len)
    memcpy(c->shared->secret, secret, secret_len);
  c->shared->secret_len = secret_len;
  OPENSSL_cleanse(secret, sizeof secret);
  c->shared->have_checkpoint = have_ck;
  if (have_ck) {
    c->shared->checkpoint = ck;
    snprintf(c->shared->checkpoint.job, sizeof c->shared->checkpoint.job, "%s", c->job);
  }
  c->shared->generation++;
  pthread_cond_broadcast(&c->shared->cv);
  pthread_mutex_unlock(&c->shared->mu);
}

static void put_failed(wg_control_t *c, const char *job, const char *why) {
  wg_progress_snap_t s;
  char key[256];
  memset(&s, 0, sizeof s);
  snprintf(s.job, sizeof s.job, "%s", job);
  s.state = WG_STATE_FAILED;
  s.loss = s.accuracy = s.step_time = 0;
  snprintf(s.error, sizeof s.error, "%.250s", why);
  char *json = wg_progress_snap_to_json(&s);
  if (json && wagma_key_job_progress(&c->keys, job, c->opt->name, key, sizeof key) == 0)
    wagma_etcd_put(c->etcd, key, json, strlen(json), 0, NULL);
  free(json);
}

/* Hands the runner a new job (cfg), or with cfg NULL takes its job away (the runner releases
 * its program); either way without a plan or checkpoint until offered. */
static void hand_job(wg_control_t *c, const wg_job_config_t *cfg) {
  pthread_mutex_lock(&c->shared->mu);
  c->shared->assigned = cfg != NULL;
  if (cfg)
    c->shared->job = *cfg;
  c->shared->have_plan = 0;
  wagma_plan_free(&c->shared->plan);
  OPENSSL_cleanse(c->shared->secret, sizeof c->shared->secret);
  c->shared->secret_len = 0;
  c->shared->have_checkpoint = 0;
  c->shared->generation++;
  pthread_cond_broadcast(&c->shared->cv);
  pthread_mutex_unlock(&c->shared->mu);
}

/* Reads the spec and the plan of c->job and starts the plan watch. */
static void load_job(wg_control_t *c) {
  char key[256], err[256];
  wagma_etcd_kv_t *kv = NULL;
  wagma_etcd_range_t r;
  wg_job_config_t cfg;
  int e;
  memset(&r, 0, sizeof r);
  if (c->job_loaded || !c->job[0] || wg_mono() < c->next_job_load)
    return;
  c->next_job_load = wg_mono() + 1.0;
  wagma_key_job_spec(&c->keys, c->job, key, sizeof key);
  if ((e = wagma_etcd_get(c->etcd, key, &kv, NULL)) != 0) {
    if (e != WAGMA_ENOTFOUND)
      LOG(c, WAGMA_LOG_WARN, "job %s: cannot read the spec: %s", c->job, wagma_strerror(e));
    return;
  }
  e = wg_job_config_from_spec_json(kv->value, kv->value_len, c->job, &cfg, err, sizeof err);
  wagma_etcd_kv_free(kv);
  if (e) {
    LOG(c, WAGMA_LOG_ERROR, "%s", err);
    put_failed(c, c->job, err);
    c->job_loaded = 1; /* nothing to train; wait for the assignment to go */
    return;
  }
  wagma_key_job_plan(&c->keys, c->job, key, sizeof key);
  if (wagma_etcd_range(c->etcd, key, NULL, &r) != 0)
    return;
  wagma_etcd_watch_options_t wo = {.start_revision = r.revision + 1};
  if (wagma_etcd_watch_start(c->etcd, key, &wo, on_plan, c, &c->plan_watch) != 0) {
    c->plan_watch = NULL;
    wagma_etcd_range_free(&r);
    return;
  }
  LOG(c, WAGMA_LOG_INFO, "assigned to job %s", c->job);
  hand_job(c, &cfg);
  c->plan_epoch = 0;
  c->job_loaded = 1;
  if (r.n)
    offer_plan(c, r.kvs[0].value, r.kvs[0].value_len);
  wagma_etcd_range_free(&r);
}

static void drop_job(wg_control_t *c) {
  wagma_etcd_watch_stop(c->plan_watch);
  c->plan_watch = NULL;
  pthread_mutex_lock(&c->mu);
  free(c->plan.value);
  c->plan.value = NULL;
  c->plan.changed = c->plan.dead = 0;
  pthread_mutex_unlock(&c->mu);
  if (c->job[0])
    LOG(c, WAGMA_LOG_INFO, "released from job %s", c->job);
  c->job[0] = '\0';
  c->job_loaded = 0;
  c->plan_epoch = 0;
  hand_job(c, NULL);
}

static void follow_assignment(wg_control_t *c) {
  char job[WAGMA_NAME_MAX] = "";
  char *plan = NULL;
  int changed, plan_changed, plan_dead;
  pthread_mutex_lock(&c->mu);
  changed = c->assign.changed;
  c->assign.changed = 0;
  if (changed && c->assign.present && c->assign.value)
    wg_assignment_job(c->assign.value, strlen(c->assign.value), job, sizeof job);
  pthread_mutex_unlock(&c->mu);
  if (changed && strcmp(job, c->job) != 0) {
    drop_job(c);
    snprintf(c->job, sizeof c->job, "%s", job);
    c->next_job_load = 0;
  }
  load_job(c);
  if (!c->job_loaded)
    return;
  pthread_mutex_lock(&c->mu);
  plan_changed = c->plan.changed;
  plan_dead = c->plan.dead;
  c->plan.changed = 0;
  plan = c->plan.value;
  c->plan.value = NULL;
  pthread_mutex_unlock(&c->mu);
  if (plan_changed && plan)
    offer_plan(c, plan, strlen(plan));
  free(plan);
  if (plan_dead) { /* compacted: read the plan again and watch from there */
    char key[256];
    wagma_etcd_range_t r;
    memset(&r, 0, sizeof r);
    wagma_etcd_watch_stop(c->plan_watch);
    c->plan_watch = NULL;
    wagma_key_job_plan(&c->keys, c->job, key, sizeof key);
    if (wagma_etcd_range(c->etcd, key, NULL, &r) == 0) {
      wagma_etcd_watch_options_t wo = {.start_revision = r.revision + 1};
      pthread_mutex_lock(&c->mu);
      c->plan.dead = 0;
      pthread_mutex_unlock(&c->mu);
      if (wagma_etcd_watch_start(c->etcd, key, &wo, on_plan, c, &c->plan_watch) != 0) {
        c->plan_watch = NULL;
        pthread_mutex_lock(&c->mu);
        c->plan.dead = 1; /* try again on the next pass */
        pthread_mutex_unlock(&c->mu);
      }
      if (r.n)
        offer_plan(c, r.kvs[0].value, r.kvs[0].value_len);
      wagma_etcd_range_free(&r);
    }
  }
}

/* ---- progress and checkpoint records ------------------------------------------------------ */

static void publish(wg_control_t *c, int force) {
  wg_progress_snap_t snap;
  wg_checkpoint_rec_t ck;
  int have_progress = 0, have_ck = 0;
  char key[256];
  pthread_mutex_lock(&c->shared->mu);
  if (c->shared->progress_dirty && (force || c->shared->progress_urgent ||
                                    wg_mono() - c->last_progress >= c->opt->progress_interval_s)) {
    snap = c->shared->progress;
    c->shared->progress_dirty = c->shared->progress_urgent = 0;
    have_progress = 1;
  }
  if (c->shared->checkpoint_dirty) {
    ck = c->shared->checkpoint_out;
    c->shared->checkpoint_dirty = 0;
    have_ck = 1;
  }
  pthread_mutex_unlock(&c->shared->mu);
  if (have_progress && snap.job[0]) {
    char *json = wg_progress_snap_to_json(&snap);
    c->last_progress = wg_mono();
    if (json && wagma_key_job_progress(&c->keys, snap.job, c->opt->name, key, sizeof key) == 0 &&
        wagma_etcd_put(c->etcd, key, json, strlen(json), 0, NULL) != 0) {
      pthread_mutex_lock(&c->shared->mu);
      if (!c->shared->progress_dirty) { /* keep it for the next try */
        c->shared->progress_dirty = 1;
        c->shared->progress_urgent = snap.state != WG_STATE_RUNNING;
      }
      pthread_mutex_unlock(&c->shared->mu);
    }
    free(json);
  }
  if (have_ck && ck.job[0]) {
    char *json = wg_checkpoint_rec_to_json(&ck, c->opt->name);
    if (json && wagma_key_job_checkpoint(&c->keys, ck.job, key, sizeof key) == 0) {
      if (wagma_etcd_put(c->etcd, key, json, strlen(json), 0, NULL) == 0)
        LOG(c, WAGMA_LOG_INFO, "job %s: checkpoint of iteration %llu recorded (%s)", ck.job,
            (unsigned long long)ck.iteration, ck.path);
    }
    free(json);
  }
}

/* ---- thread ------------------------------------------------------------------------------ */

/* ---- a quarantine for being unreachable (docs/design.md §7.3) -------------------------------- */

/* While this agent has no job: every QUARANTINE_IDLE_S, whether the coordinator quarantined it
 * for being cut off from its peers (a record of this registration with addresses to probe);
 * while it is, every QUARANTINE_PROBE_S, whether it reaches all those addresses again; once
 * it does, its registration says so (agent info "reached" = the record's since, one Txn
 * guarded by the registration's create revision), and the coordinator ends the quarantine.
 * Each check is two reads; a probe connects with a 1 s deadline per address. */
#define QUARANTINE_IDLE_S 5.0
#define QUARANTINE_PROBE_S 1.0
static void follow_quarantine(wg_control_t *c) {
  char qkey[256], akey[256], why[160];
  wagma_etcd_kv_t *qkv = NULL, *akv = NULL;
  wagma_quarantine_t q;
  wagma_api_error_t aerr;
  double next = QUARANTINE_IDLE_S;
  if (!c->lease || c->job[0] || wg_mono() < c->next_quarantine_check)
    return;
  if (wagma_key_quarantine(&c->keys, c->opt->name, qkey, sizeof qkey) ||
      wagma_key_agent(&c->keys, c->opt->name, akey, sizeof akey) ||
      wagma_etcd_get(c->etcd, qkey, &qkv, NULL) != 0 ||
      wagma_etcd_get(c->etcd, akey, &akv, NULL) != 0 ||
      wagma_quarantine_from_json(qkv->value, qkv->value_len, &q, &aerr) != 0)
    goto out;
  if (q.nprobe == 0 || q.reachable > 0 || q.registration != akv->create_revision ||
      q.since == c->reached)
    goto out; /* not for being unreachable, over, of an older registration, or said already */
  next = QUARANTINE_PROBE_S;
  int ok =
      wg_probe_reach((const char(*)[WAGMA_API_ADDR_MAX])q.probe, q.nprobe, 1.0, why, sizeof why);
  if (ok < q.nprobe)
    goto out;
  char *info = wg_agent_info_json(c->opt, c->started, q.since);
  wagma_etcd_cmp_t same = {.key = akey,
                           .target = WAGMA_ETCD_CMP_CREATE,
                           .result = WAGMA_ETCD_EQUAL,
                           .number = akv->create_revision};
  wagma_etcd_op_t put = {.type = WAGMA_ETCD_OP_PUT,
                         .key = akey,
                         .value = info,
                         .value_len = info ? strlen(info) : 0,
                         .lease = c->lease};
  wagma_etcd_txn_result_t tr;
  memset(&tr, 0, sizeof tr);
  if (info && wagma_etcd_txn(c->etcd, &same, 1, &put, 1, NULL, 0, &tr) == 0) {
    c->reached = q.since;
    LOG(c, WAGMA_LOG_INFO,
        "quarantined for being unreachable (job %s), this node reaches its %d peers again: "
        "said so in its registration",
        q.job, q.nprobe);
  }
  wagma_etcd_txn_result_free(&tr);
  free(info);
out:
  c->next_quarantine_check = wg_mono() + next;
  wagma_etcd_kv_free(qkv);
  wagma_etcd_kv_free(akv);
}

/* Startup: wait for etcd, register; the outcome goes to c->startup for wg_control_state. */
static int startup(wg_control_t *c) {
  char err[sizeof c->startup_error] = "";
  int e = wagma_etcd_wait_ready(c->etcd, c->opt->etcd.endpoints, c->opt->etcd.startup_timeout_s,
                                stop_asked, c, err, sizeof err);
  if (e == 0)
    e = register_at_start(c, err, sizeof err);
  pthread_mutex_lock(&c->mu);
  c->startup = e;
  snprintf(c->startup_error, sizeof c->startup_error, "%s", err);
  pthread_mutex_unlock(&c->mu);
  return e;
}

static void *control_main(void *arg) {
  wg_control_t *c = arg;
  if (startup(c) != 0)
    return NULL;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    if (stop)
      break;
    ensure_registered(c);
    ensure_assignment_watch(c);
    follow_assignment(c);
    follow_quarantine(c);
    publish(c, 0);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* c->cv uses CLOCK_MONOTONIC */
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->stop && !c->assign.changed && !c->plan.changed)
      pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    pthread_mutex_unlock(&c->mu);
  }
  return NULL;
}

int wg_control_start(const wg_agent_options_t *opt, wg_shared_t *shared, wg_control_t **out,
                     char *err, size_t err_len) {
  wg_control_t *c = calloc(1, sizeof *c);
  int e;
  *out = NULL;
  snprintf(err, err_len, "out of memory");
  if (!c)
    return WAGMA_ENOMEM;
  c->opt = opt;
  c->shared = shared;
  c->started = wg_wall();
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  if ((e = wagma_keys_init(&c->keys, opt->prefix))) {
    snprintf(err, err_len, "bad --prefix %s", opt->prefix);
    goto fail;
  }
  char ping_key[sizeof c->keys.prefix + 2];
  snprintf(ping_key, sizeof ping_key, "%s/", c->keys.prefix); /* a user's role may read it */
  wagma_etcd_options_t eo = {
      .log_fn = wg_agent_log, .log_user = (void *)opt->name, .ping_key = ping_key};
  wagma_etcd_cli_options(&opt->etcd, &eo);
  if ((e = wagma_etcd_open(&eo, &c->etcd))) {
    snprintf(err, err_len, "cannot open etcd %s: %s", opt->etcd.endpoints, wagma_strerror(e));
    goto fail;
  }
  c->startup = 1;
  if (pthread_create(&c->thread, NULL, control_main, c) != 0) {
    snprintf(err, err_len, "cannot start the control thread");
    e = WAGMA_EIO;
    goto fail;
  }
  c->thread_started = 1;
  *out = c;
  return 0;
fail:
  wagma_etcd_close(c->etcd);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
  return e;
}

int wg_control_state(wg_control_t *c, char *err, size_t err_len) {
  pthread_mutex_lock(&c->mu);
  int state = c->startup;
  if (state < 0)
    snprintf(err, err_len, "%s", c->startup_error);
  pthread_mutex_unlock(&c->mu);
  return state;
}

void wg_control_stop(wg_control_t *c) {
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->thread_started)
    pthread_join(c->thread, NULL);
  /* Leave first, so the coordinator replans at once; then the last progress. */
  wagma_etcd_keepalive_stop(c->keepalive);
  c->keepalive = NULL;
  if (c->lease) {
    int e = wagma_etcd_lease_revoke(c->etcd, c->lease);
    LOG(c, e ? WAGMA_LOG_WARN : WAGMA_LOG_INFO, "lease revoked: %s",
        e ? wagma_strerror(e) : "left cleanly");
  } else if (c->lost_lease) {
    /* given up as lost and not registered again: it may still hold our key (an etcd that
     * restarted renewed it), and the coordinator must see us leave now, not a TTL later */
    (void)wagma_etcd_lease_revoke(c->etcd, c->lost_lease);
  }
  publish(c, 1);
  wagma_etcd_watch_stop(c->plan_watch);
  wagma_etcd_watch_stop(c->assign_watch);
  wagma_etcd_close(c->etcd);
  free(c->assign.value);
  free(c->plan.value);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}
